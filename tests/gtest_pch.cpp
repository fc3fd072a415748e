// The program that owns the GoogleTest binaries' precompiled header (tests/CMakeLists.txt,
// CHORUS_GTEST_PCH): compiled with their flags so that they can reuse its header. No test runs it.
#include <gtest/gtest.h>

TEST(GtestPch, Builds) { SUCCEED(); }
