// DlLibrary (transports/dl_library.hpp), the run-time loader of the UCX and verbs transports: the
// first name that loads, and errors naming the library and the symbol.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "transports/dl_library.hpp"

using chorus::transport::DlLibrary;
using chorus::transport::LoadedApi;

namespace {

TEST(DlLibrary, ResolvesFromTheFirstNameThatLoads) {
  DlLibrary lib({"libchorus-test-absent.so.0", "libc.so.6"}, "never shown");
  size_t (*len)(const char*) = nullptr;
  lib.resolve("strlen", len);
  ASSERT_NE(len, nullptr) << lib.error();
  EXPECT_EQ(len("four"), 4u);
  EXPECT_EQ(lib.error(), "");
}

TEST(DlLibrary, TheFirstMissingSymbolIsNamed) {
  DlLibrary lib({"libc.so.6"}, "never shown", "too old?");
  void (*fn)() = nullptr;
  lib.resolve("chorus_test_absent_1", fn);
  EXPECT_EQ(fn, nullptr);
  lib.resolve("chorus_test_absent_2", fn);
  EXPECT_EQ(lib.error(), "libc.so.6 has no chorus_test_absent_1 (too old?)");
  DlLibrary plain({"libc.so.6"}, "never shown");
  plain.resolve("chorus_test_absent_1", fn);
  EXPECT_EQ(plain.error(), "libc.so.6 has no chorus_test_absent_1");
}

TEST(DlLibrary, ALibraryThatDoesNotLoadIsNamedWithHowToInstallIt) {
  DlLibrary lib({"libchorus-test-absent-a.so.1", "libchorus-test-absent-b.so.1"}, "install it");
  size_t (*len)(const char*) = nullptr;
  lib.resolve("strlen", len);  // not looked up anywhere else
  EXPECT_EQ(len, nullptr);
  EXPECT_EQ(lib.error().rfind("cannot load libchorus-test-absent-a.so.1 or libchorus-test-absent-b.so.1 "
                              "(install it): ",
                              0),
            0u)
      << lib.error();
}

TEST(LoadedApi, GivesTheTableOrWhyNot) {
  struct Api {
    int x;
  };
  const LoadedApi<Api> ok{{7}, ""};
  std::string why = "untouched";
  ASSERT_NE(ok.get(&why), nullptr);
  EXPECT_EQ(ok.get(&why)->x, 7);
  EXPECT_EQ(why, "untouched");
  const LoadedApi<Api> failed{{0}, "cannot load it"};
  EXPECT_EQ(failed.get(&why), nullptr);
  EXPECT_EQ(why, "cannot load it");
  EXPECT_EQ(failed.get(nullptr), nullptr);
}

}  // namespace
