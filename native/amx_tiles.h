// AMX's tile configuration (palette 1), shared by the AMX forms (qmatmul_x86.cc,
// qmatmul_ggml_x86.cc). Included only by objects compiled for AMX.
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace specrt {
namespace {

struct TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};

  void set(int tile, int r, int bytes) { rows[tile] = static_cast<uint8_t>(r), colsb[tile] = static_cast<uint16_t>(bytes); }
  void load() const { _tile_loadconfig(this); }
};

}  // namespace
}  // namespace specrt
