// The course's tensor file format, shared by every C++ program under cpp/ (one copy; Python's
// side is course_utils/deploy/tensor_file.py):
//   8 bytes of magic "AOTITNSR", an int64 count of dimensions n, n int64 sizes, then the float32
//   values in row-major order; everything little-endian. Plain on purpose: no pickle reader needed.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace course {

constexpr std::array<char, 8> kTensorMagic = {'A', 'O', 'T', 'I', 'T', 'N', 'S', 'R'};

// Read one float32 tensor; throws std::runtime_error saying what is wrong with the file.
inline at::Tensor read_tensor(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::array<char, 8> magic{};
  in.read(magic.data(), magic.size());
  if (!in || magic != kTensorMagic) throw std::runtime_error(path + " is not a tensor file (bad magic)");
  int64_t ndim = 0;
  in.read(reinterpret_cast<char*>(&ndim), sizeof ndim);
  if (!in || ndim < 0 || ndim > 16) throw std::runtime_error(path + ": bad number of dimensions");
  std::vector<int64_t> sizes(static_cast<size_t>(ndim));
  in.read(reinterpret_cast<char*>(sizes.data()), static_cast<std::streamsize>(ndim * sizeof(int64_t)));
  if (!in) throw std::runtime_error(path + ": truncated header");
  at::Tensor t = at::empty(sizes, at::kFloat);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()),
          static_cast<std::streamsize>(t.numel() * sizeof(float)));
  if (!in) throw std::runtime_error(path + ": fewer values than the shape says");
  return t;
}

// Write one tensor (converted to contiguous float32 on the CPU).
inline void write_tensor(const std::string& path, const at::Tensor& tensor) {
  at::Tensor t = tensor.to(at::kCPU, at::kFloat).contiguous();
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + path);
  out.write(kTensorMagic.data(), kTensorMagic.size());
  const int64_t ndim = t.dim();
  out.write(reinterpret_cast<const char*>(&ndim), sizeof ndim);
  for (int64_t size : t.sizes()) out.write(reinterpret_cast<const char*>(&size), sizeof size);
  out.write(reinterpret_cast<const char*>(t.data_ptr<float>()),
            static_cast<std::streamsize>(t.numel() * sizeof(float)));
  if (!out) throw std::runtime_error("failed writing " + path);
}

}  // namespace course
