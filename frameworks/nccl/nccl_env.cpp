// libnccl.so.2 from Chorus: NCCL's environment variables mapped onto Chorus's (read when the
// library loads, before Chorus reads its settings; a CHORUS_* variable that is set wins), and
// NCCL's parameter API (ncclParam*) over Chorus's settings under their NCCL names. The table of
// what maps to what is in docs/frameworks.md.
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "frameworks/nccl/shim.hpp"

using shim::fromChorus;
using shim::refuse;

namespace {

using Translate = std::function<std::optional<std::string>(const std::string&)>;

struct Mapping {
  const char* nccl;
  const char* chorus;
  // nullopt: the value has no Chorus counterpart (ignored, with a warning); "": nothing to change.
  Translate translate;
};

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::vector<std::string> splitList(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}
std::optional<std::string> same(const std::string& v) { return v; }

std::optional<std::string> debugLevel(const std::string& v) {
  const std::string u = upper(v);
  if (u == "VERSION" || u == "WARN") return "WARN";
  if (u == "INFO" || u == "TRACE") return u;
  return std::nullopt;
}

// NCCL's subsystems that Chorus has; the others are dropped.
std::optional<std::string> debugSubsys(const std::string& v) {
  std::string list = upper(v);
  std::string prefix;
  if (!list.empty() && list[0] == '^') {
    prefix = "^";
    list.erase(0, 1);
  }
  static const std::map<std::string, std::string> kNames = {{"INIT", "INIT"},  {"BOOTSTRAP", "BOOTSTRAP"},
                                                            {"GRAPH", "TOPO"}, {"TUNING", "TUNING"},
                                                            {"SHM", "SHM"},    {"NET", "NET"},
                                                            {"ALL", "ALL"}};
  std::string out;
  for (const std::string& name : splitList(list, ',')) {
    auto it = kNames.find(name);
    if (it != kNames.end()) out += (out.empty() ? "" : ",") + it->second;
  }
  if (out.empty()) return std::nullopt;
  return prefix + out;
}

std::optional<std::string> socketFamily(const std::string& v) {
  if (v == "AF_INET") return "4";
  if (v == "AF_INET6") return "6";
  return std::nullopt;
}

// One algorithm for every collective ("Ring", "Tree") or per collective ("allreduce:tree;
// allgather:ring"). A set of allowed algorithms ("Ring,Tree", "^NVLS") has no Chorus counterpart
// (Chorus takes one algorithm per collective and size).
std::optional<std::string> algo(const std::string& v) {
  auto one = [](const std::string& coll, const std::string& a) -> std::optional<std::string> {
    const std::string name = lower(a);
    if (name == "ring") {
      if (coll.empty()) return "allreduce:ring,reducescatter:ring,allgather:ring";
      if (coll == "allreduce" || coll == "reducescatter" || coll == "allgather") return coll + ":ring";
    }
    if (name == "tree" && (coll.empty() || coll == "allreduce")) return "allreduce:tree";
    return std::nullopt;
  };
  if (v.find(':') == std::string::npos) return one("", v);
  std::string out;
  for (const std::string& part : splitList(v, ';')) {
    const size_t colon = part.find(':');
    if (colon == std::string::npos) return std::nullopt;
    auto t = one(lower(part.substr(0, colon)), part.substr(colon + 1));
    if (!t) return std::nullopt;
    out += (out.empty() ? "" : ",") + *t;
  }
  return out;
}

// Only turning LL off maps: Chorus's device path sends allreduces up to CHORUS_CUDA_LL_BYTES with LL.
std::optional<std::string> proto(const std::string& v) {
  const std::string u = upper(v);
  bool excludes = !u.empty() && u[0] == '^';
  bool hasLL = false;
  for (const std::string& p : splitList(excludes ? u.substr(1) : u, ','))
    if (p == "LL") hasLL = true;
  if (excludes == hasLL) return "0";
  return "";  // LL allowed: Chorus's choice stands
}

// "mlx5_0:1,mlx5_1" or "=mlx5_0": Chorus takes one device (prefix) and port: the first listed.
std::optional<std::string> ibHca(const std::string& v) {
  std::string s = v;
  if (!s.empty() && s[0] == '=') s.erase(0, 1);
  if (s.empty() || s[0] == '^') return std::nullopt;
  return s.substr(0, s.find_first_of(",:"));
}
std::optional<std::string> ibPort(const std::string& v) {
  std::string s = v;
  if (!s.empty() && s[0] == '=') s.erase(0, 1);
  if (s.empty() || s[0] == '^') return std::nullopt;
  const std::string first = s.substr(0, s.find(','));
  const size_t colon = first.find(':');
  if (colon == std::string::npos) return std::nullopt;
  return first.substr(colon + 1);
}

std::optional<std::string> disabled(const std::string& v) {
  if (v == "1") return "0";
  return std::nullopt;
}

std::optional<std::string> net(const std::string& v) {
  const std::string u = upper(v);
  if (u == "SOCKET") return "tcp";
  if (u == "IB") return "ib";
  if (u == "UCX") return "ucx";
  return std::nullopt;
}
std::optional<std::string> ibDisable(const std::string& v) {
  if (v == "1") return "ucx,tcp";
  return std::nullopt;
}

// In order: of two mappings onto one Chorus variable, the first set wins.
const std::vector<Mapping>& mappings() {
  static const std::vector<Mapping> kMappings = {
      {"NCCL_DEBUG", "CHORUS_DEBUG", debugLevel},
      {"NCCL_DEBUG_SUBSYS", "CHORUS_DEBUG_SUBSYS", debugSubsys},
      {"NCCL_SOCKET_IFNAME", "CHORUS_SOCKET_IFNAME", same},
      {"NCCL_SOCKET_FAMILY", "CHORUS_SOCKET_FAMILY", socketFamily},
      {"NCCL_ALGO", "CHORUS_ALGO", algo},
      {"NCCL_PROTO", "CHORUS_CUDA_LL_BYTES", proto},
      {"NCCL_IB_HCA", "CHORUS_IB_HCA", ibHca},
      {"NCCL_IB_HCA", "CHORUS_IB_PORT", ibPort},
      {"NCCL_IB_GID_INDEX", "CHORUS_IB_GID_INDEX", same},
      {"NCCL_BUFFSIZE", "CHORUS_SHM_FIFO_BYTES", same},
      {"NCCL_BUFFSIZE", "CHORUS_SOCKET_BUFFER_BYTES", same},
      {"NCCL_P2P_DISABLE", "CHORUS_CUDA_IPC", disabled},
      {"NCCL_NET", "CHORUS_NET", net},
      {"NCCL_IB_DISABLE", "CHORUS_NET", ibDisable},
  };
  return kMappings;
}

// At load: NCCL_* values copied onto the CHORUS_* variables that are unset.
__attribute__((constructor)) void applyNcclEnvironment() {
  for (const Mapping& m : mappings()) {
    const char* v = std::getenv(m.nccl);
    if (v == nullptr) continue;
    std::optional<std::string> t = m.translate(v);
    if (!t) {
      // A second mapping of the same variable may take it (NCCL_IB_HCA's port is optional).
      if (std::strcmp(m.chorus, "CHORUS_IB_PORT") != 0)
        std::fprintf(stderr,
                     "chorus libnccl: %s='%s' has no Chorus counterpart; ignored (docs/frameworks.md)\n",
                     m.nccl, v);
      continue;
    }
    if (!t->empty() && std::getenv(m.chorus) == nullptr) setenv(m.chorus, t->c_str(), 0);
  }
}

}  // namespace

// ---- ncclParam* (NCCL 2.30) ----------------------------------------------------------------------
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 30, 0)

// The handle is the key (owned here, never freed) and the Chorus setting it reads.
struct ncclParamHandle {
  std::string key;
  std::string chorus;
};

namespace {

std::mutex gParamsMu;
std::map<std::string, ncclParamHandle>& handles() {
  static auto* m = new std::map<std::string, ncclParamHandle>();
  return *m;
}

// The Chorus setting behind `key`: an NCCL name of the table, or a CHORUS_* name itself.
std::optional<std::string> settingOf(const std::string& key) {
  for (const Mapping& m : mappings())
    if (key == m.nccl) return std::string(m.chorus);
  const char* v = nullptr;
  if (key.rfind("CHORUS_", 0) == 0 && chorusConfigGet(key.c_str(), &v) == chorusSuccess) return key;
  return std::nullopt;
}

ncclResult_t read(const ncclParamHandle* h, const char* call, std::string* out) {
  if (!h) return refuse(ncclInvalidArgument, std::string(call) + ": handle is NULL");
  const char* v = nullptr;
  if (chorusResult_t r = chorusConfigGet(h->chorus.c_str(), &v); r != chorusSuccess) return fromChorus(r);
  *out = v;
  return ncclSuccess;
}

template <typename T>
ncclResult_t readInt(ncclParamHandle_t h, T* out, const char* call) {
  if (!out) return refuse(ncclInvalidArgument, std::string(call) + ": out is NULL");
  std::string v;
  if (ncclResult_t r = read(h, call, &v); r != ncclSuccess) return r;
  errno = 0;
  char* end = nullptr;
  bool ok = !v.empty();
  if constexpr (std::numeric_limits<T>::is_signed) {
    const long long n = std::strtoll(v.c_str(), &end, 10);
    ok = ok && errno == 0 && *end == '\0' && n >= std::numeric_limits<T>::min() &&
         n <= std::numeric_limits<T>::max();
    if (ok) *out = static_cast<T>(n);
  } else {
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    ok = ok && v[0] != '-' && errno == 0 && *end == '\0' && n <= std::numeric_limits<T>::max();
    if (ok) *out = static_cast<T>(n);
  }
  if (!ok)
    return refuse(ncclInvalidArgument,
                  std::string(call) + ": " + h->key + " = '" + v +
                      "' is not an integer of this width (read it with ncclParamGetStr)");
  return ncclSuccess;
}

}  // namespace

SHIM_EXPORT ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key) {
  START
  if (!out || !key) return refuse(ncclInvalidArgument, "ncclParamBind: out or key is NULL");
  std::optional<std::string> chorus = settingOf(key);
  if (!chorus)
    return refuse(ncclInvalidArgument,
                  std::string("ncclParamBind: ") + key +
                      " is not a parameter of Chorus's libnccl (ncclParamGetAllParameterKeys "
                      "lists them)");
  std::lock_guard lk(gParamsMu);
  auto [it, fresh] = handles().try_emplace(key, ncclParamHandle{key, *chorus});
  (void)fresh;
  *out = &it->second;
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclParamBind)

#define PARAM_GET(suffix, type)                                                   \
  SHIM_EXPORT ncclResult_t ncclParamGet##suffix(ncclParamHandle_t h, type* out) { \
    START                                                                         \
    return readInt(h, out, "ncclParamGet" #suffix);                               \
    END                                                                           \
  }                                                                               \
  SHIM_ALIAS(ncclParamGet##suffix)
PARAM_GET(I8, int8_t)
PARAM_GET(I16, int16_t)
PARAM_GET(I32, int32_t)
PARAM_GET(I64, int64_t)
PARAM_GET(U8, uint8_t)
PARAM_GET(U16, uint16_t)
PARAM_GET(U32, uint32_t)
PARAM_GET(U64, uint64_t)
#undef PARAM_GET

SHIM_EXPORT ncclResult_t ncclParamGetStr(ncclParamHandle_t h, const char** out) {
  START
  if (!out) return refuse(ncclInvalidArgument, "ncclParamGetStr: out is NULL");
  thread_local std::string value;
  if (ncclResult_t r = read(h, "ncclParamGetStr", &value); r != ncclSuccess) return r;
  *out = value.c_str();
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclParamGetStr)

// The value's text, without a terminating NUL; *len is its length even when maxLen is too small
// (then ncclInvalidArgument and nothing is copied).
SHIM_EXPORT ncclResult_t ncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len) {
  START
  if (!len || (maxLen > 0 && !out)) return refuse(ncclInvalidArgument, "ncclParamGet: out or len is NULL");
  std::string value;
  if (ncclResult_t r = read(h, "ncclParamGet", &value); r != ncclSuccess) return r;
  *len = static_cast<int>(value.size());
  if (maxLen < static_cast<int>(value.size()))
    return refuse(ncclInvalidArgument, "ncclParamGet: " + h->key + " needs " + std::to_string(value.size()) +
                                           " bytes, maxLen is " + std::to_string(maxLen));
  std::memcpy(out, value.data(), value.size());
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclParamGet)

SHIM_EXPORT ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen) {
  START
  if (!key || !value) return refuse(ncclInvalidArgument, "ncclParamGetParameter: key or value is NULL");
  ncclParamHandle_t h = nullptr;
  if (ncclResult_t r = ncclParamBind(&h, key); r != ncclSuccess) return r;
  thread_local std::string text;
  if (ncclResult_t r = read(h, "ncclParamGetParameter", &text); r != ncclSuccess) return r;
  *value = text.c_str();
  if (valueLen) *valueLen = static_cast<int>(text.size());
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclParamGetParameter)

// The NCCL names that map onto Chorus settings (CHORUS_* names bind too, but are not listed).
SHIM_EXPORT ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen) {
  START
  if (!table || !tableLen) return refuse(ncclInvalidArgument, "ncclParamGetAllParameterKeys: NULL argument");
  thread_local std::vector<const char*> keys;
  keys.clear();
  for (const Mapping& m : mappings())
    if (keys.empty() || std::strcmp(keys.back(), m.nccl) != 0) keys.push_back(m.nccl);
  *table = keys.data();
  *tableLen = static_cast<int>(keys.size());
  return ncclSuccess;
  END
}
SHIM_ALIAS(ncclParamGetAllParameterKeys)

SHIM_EXPORT void ncclParamDumpAll(void) {
  for (const Mapping& m : mappings()) {
    const char* v = nullptr;
    if (chorusConfigGet(m.chorus, &v) == chorusSuccess)
      std::fprintf(stderr, "%s=%s (%s)\n", m.nccl, v, m.chorus);
  }
}
SHIM_EXPORT void pncclParamDumpAll(void) __attribute__((alias("ncclParamDumpAll")));

#endif  // NCCL 2.30
