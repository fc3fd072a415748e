#include "chorus/train/tensor_parallel.hpp"

#include <cstring>
#include <string>

namespace chorus::train {

namespace {
void requireDivisible(size_t features, const Communicator& tp, const char* layer, const char* which) {
  if (features == 0 || features % static_cast<size_t>(tp.size()) != 0)
    throw Error(chorusInvalidArgument, std::string(layer) + ": " + which + " " + std::to_string(features) +
                                           " does not divide evenly across " + std::to_string(tp.size()) +
                                           " tensor-parallel ranks");
}
}  // namespace

template <typename T>
void linearForward(const T* x, size_t batch, size_t in, const T* w, const T* b, size_t out, T* y) {
  for (size_t r = 0; r < batch; ++r) {
    const T* xr = x + r * in;
    T* yr = y + r * out;
    for (size_t o = 0; o < out; ++o) {
      const T* wo = w + o * in;
      T acc = 0;
      for (size_t i = 0; i < in; ++i) acc += xr[i] * wo[i];
      yr[o] = b ? acc + b[o] : acc;
    }
  }
}

template <typename T>
void linearBackward(const T* x, const T* dy, size_t batch, size_t in, const T* w, size_t out, T* dw, T* db,
                    T* dx) {
  if (dx) std::memset(dx, 0, batch * in * sizeof(T));
  for (size_t r = 0; r < batch; ++r) {
    const T* xr = x + r * in;
    const T* dyr = dy + r * out;
    for (size_t o = 0; o < out; ++o) {
      const T g = dyr[o];
      if (db) db[o] += g;
      T* dwo = dw + o * in;
      for (size_t i = 0; i < in; ++i) dwo[i] += g * xr[i];
      if (dx) {
        const T* wo = w + o * in;
        T* dxr = dx + r * in;
        for (size_t i = 0; i < in; ++i) dxr[i] += g * wo[i];
      }
    }
  }
}

template <typename T>
ColumnParallelLinear<T>::ColumnParallelLinear(Communicator& tp, size_t inFeatures, size_t outFeatures)
    : tp_(&tp), in_(inFeatures), out_(outFeatures) {
  requireDivisible(outFeatures, tp, "ColumnParallelLinear", "output features");
  outLocal_ = out_ / static_cast<size_t>(tp.size());
}

template <typename T>
void ColumnParallelLinear<T>::shard(const T* fullWeight, const T* fullBias, T* w, T* b) const {
  const size_t first = static_cast<size_t>(tp_->rank()) * outLocal_;
  std::memcpy(w, fullWeight + first * in_, outLocal_ * in_ * sizeof(T));
  std::memcpy(b, fullBias + first, outLocal_ * sizeof(T));
}

template <typename T>
void ColumnParallelLinear<T>::forward(const T* x, size_t batch, const T* w, const T* b, T* y) const {
  linearForward(x, batch, in_, w, b, outLocal_, y);
}

template <typename T>
void ColumnParallelLinear<T>::backward(const T* x, const T* dy, size_t batch, const T* w, T* dw, T* db,
                                       T* dx) const {
  linearBackward(x, dy, batch, in_, w, outLocal_, dw, db, dx);
  if (dx && tp_->size() > 1) tp_->allReduce(dx, dx, batch * in_, dataTypeOf<T>(), ReduceOp::Sum);
}

template <typename T>
RowParallelLinear<T>::RowParallelLinear(Communicator& tp, size_t inFeatures, size_t outFeatures)
    : tp_(&tp), in_(inFeatures), out_(outFeatures) {
  requireDivisible(inFeatures, tp, "RowParallelLinear", "input features");
  inLocal_ = in_ / static_cast<size_t>(tp.size());
}

template <typename T>
void RowParallelLinear<T>::shard(const T* fullWeight, const T* fullBias, T* w, T* b) const {
  const size_t first = static_cast<size_t>(tp_->rank()) * inLocal_;
  for (size_t o = 0; o < out_; ++o)
    std::memcpy(w + o * inLocal_, fullWeight + o * in_ + first, inLocal_ * sizeof(T));
  std::memcpy(b, fullBias, out_ * sizeof(T));
}

template <typename T>
void RowParallelLinear<T>::forward(const T* xLocal, size_t batch, const T* w, const T* b, T* y) const {
  linearForward(xLocal, batch, inLocal_, w, static_cast<const T*>(nullptr), out_, y);
  if (tp_->size() > 1) tp_->allReduce(y, y, batch * out_, dataTypeOf<T>(), ReduceOp::Sum);
  if (b)
    for (size_t r = 0; r < batch; ++r)
      for (size_t o = 0; o < out_; ++o) y[r * out_ + o] += b[o];
}

template <typename T>
void RowParallelLinear<T>::backward(const T* xLocal, const T* dy, size_t batch, const T* w, T* dw, T* db,
                                    T* dxLocal) const {
  linearBackward(xLocal, dy, batch, inLocal_, w, out_, dw, db, dxLocal);
}

template class ColumnParallelLinear<float>;
template class ColumnParallelLinear<double>;
template class RowParallelLinear<float>;
template class RowParallelLinear<double>;
template void linearForward<float>(const float*, size_t, size_t, const float*, const float*, size_t, float*);
template void linearForward<double>(const double*, size_t, size_t, const double*, const double*, size_t,
                                    double*);
template void linearBackward<float>(const float*, const float*, size_t, size_t, const float*, size_t, float*,
                                    float*, float*);
template void linearBackward<double>(const double*, const double*, size_t, size_t, const double*, size_t,
                                     double*, double*, double*);

}  // namespace chorus::train
