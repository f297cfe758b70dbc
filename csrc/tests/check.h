// Minimal check macro shared by the torch-free C++ unit tests (ctest): report and count failures.
#pragma once
#include <cstdio>

static int failures = 0;
#define EXPECT(cond)                                                                        \
  do {                                                                                      \
    if (!(cond)) { std::printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #cond); ++failures; } \
  } while (0)
