// cuda_fp16.h for the CPU emulation (cuda_emu.h): the storage type and its conversion to float.
#pragma once
#include <cstdint>
#include <cstring>

struct __half {
  uint16_t bits;
};
inline float __half2float(__half h) {
  _Float16 f;
  std::memcpy(&f, &h.bits, sizeof f);
  return static_cast<float>(f);
}
