// Megatron-style tensor-parallel linear layers over a tensor-parallel communicator.
#pragma once

#include <cstddef>

#include "chorus/chorus.hpp"

namespace chorus::train {

/// y = x W^T + b with W (out x in) split by rows (output features) across the tp ranks of `tp`:
/// rank r holds rows [r * out/tp, (r+1) * out/tp) of W and of b, and produces those columns of y.
/// Forward needs no communication (the input is replicated); backward allreduces (sums) the input
/// gradient across the group, since each rank's part covers only its output features.
///
/// The layer holds no parameters: they are passed to each call, so that they may live in a ZeRO
/// shard, a gathered buffer, or anywhere else. Matrices are row-major. T is float or double.
template <typename T>
class ColumnParallelLinear {
 public:
  /// `outFeatures` must divide evenly by the group's size. `tp` must outlive the layer.
  ColumnParallelLinear(Communicator& tp, size_t inFeatures, size_t outFeatures);

  size_t inFeatures() const { return in_; }
  size_t localOutFeatures() const { return outLocal_; }
  size_t weightCount() const { return outLocal_ * in_; }
  size_t biasCount() const { return outLocal_; }

  /// Copies this rank's rows of the full W (out x in) and b (out) into w and b.
  void shard(const T* fullWeight, const T* fullBias, T* w, T* b) const;
  /// y (batch x localOut) = x (batch x in) w^T + b (if not null).
  void forward(const T* x, size_t batch, const T* w, const T* b, T* y) const;
  /// Adds to dw and db (if not null); writes dx (batch x in), summed over the group (if not null).
  void backward(const T* x, const T* dy, size_t batch, const T* w, T* dw, T* db, T* dx) const;

 private:
  Communicator* tp_;
  size_t in_, out_, outLocal_;
};

/// y = x W^T + b with W (out x in) split by columns (input features): rank r holds columns
/// [r * in/tp, (r+1) * in/tp) and takes those features of x (the output of a ColumnParallelLinear).
/// Forward allreduces (sums) the partial products across the group, then adds the bias, which every
/// rank holds whole (a replicated parameter: count it once when clipping). Backward needs no
/// communication.
template <typename T>
class RowParallelLinear {
 public:
  /// `inFeatures` must divide evenly by the group's size.
  RowParallelLinear(Communicator& tp, size_t inFeatures, size_t outFeatures);

  size_t localInFeatures() const { return inLocal_; }
  size_t outFeatures() const { return out_; }
  size_t weightCount() const { return out_ * inLocal_; }
  size_t biasCount() const { return out_; }

  /// Copies this rank's columns of the full W (out x in) into w, and the whole bias into b.
  void shard(const T* fullWeight, const T* fullBias, T* w, T* b) const;
  /// y (batch x out) = sum over ranks of x_local (batch x inLocal) w^T, plus b (if not null).
  void forward(const T* xLocal, size_t batch, const T* w, const T* b, T* y) const;
  /// Adds to dw and db (if not null; db is the same on every rank); writes dxLocal (batch x inLocal)
  /// if not null.
  void backward(const T* xLocal, const T* dy, size_t batch, const T* w, T* dw, T* db, T* dxLocal) const;

 private:
  Communicator* tp_;
  size_t in_, out_, inLocal_;
};

/// Dense helpers the layers use (row-major, single-threaded): y = x w^T (+ b), dx = dy w, dw += dy^T x.
template <typename T>
void linearForward(const T* x, size_t batch, size_t in, const T* w, const T* b, size_t out, T* y);
template <typename T>
void linearBackward(const T* x, const T* dy, size_t batch, size_t in, const T* w, size_t out, T* dw, T* db,
                    T* dx);

}  // namespace chorus::train
