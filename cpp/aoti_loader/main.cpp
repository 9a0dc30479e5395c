// aoti_loader: run an AOTInductor package (.pt2) from C++, without Python.
//
//   aoti_loader MODEL.pt2 INPUT.bin OUTPUT.bin
//
// INPUT.bin and OUTPUT.bin use one tiny tensor format, written and read by
// course_utils/deploy/aoti_cpp.py:
//   8 bytes   magic "AOTITNSR"
//   int64     number of dimensions n
//   n x int64 the sizes
//   float32   the values, row-major (C order)
// All integers and floats are little-endian, as on every machine the course targets.
// The package was compiled for the CPU, so the tensors stay on the CPU.

#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::array<char, 8> kMagic = {'A', 'O', 'T', 'I', 'T', 'N', 'S', 'R'};

at::Tensor read_tensor(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::array<char, 8> magic{};
  in.read(magic.data(), magic.size());
  if (!in || magic != kMagic) throw std::runtime_error(path + " is not a tensor file (bad magic)");
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

void write_tensor(const std::string& path, const at::Tensor& tensor) {
  at::Tensor t = tensor.to(at::kCPU, at::kFloat).contiguous();
  std::ofstream out(path, std::ios::binary);
  if (!out) throw std::runtime_error("cannot write " + path);
  out.write(kMagic.data(), kMagic.size());
  const int64_t ndim = t.dim();
  out.write(reinterpret_cast<const char*>(&ndim), sizeof ndim);
  for (int64_t size : t.sizes()) out.write(reinterpret_cast<const char*>(&size), sizeof size);
  out.write(reinterpret_cast<const char*>(t.data_ptr<float>()),
            static_cast<std::streamsize>(t.numel() * sizeof(float)));
  if (!out) throw std::runtime_error("failed writing " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: " << argv[0] << " MODEL.pt2 INPUT.bin OUTPUT.bin\n";
    return 2;
  }
  try {
    c10::InferenceMode no_autograd;  // inference only: no autograd bookkeeping
    torch::inductor::AOTIModelPackageLoader loader(argv[1]);
    std::vector<at::Tensor> inputs = {read_tensor(argv[2])};
    std::vector<at::Tensor> outputs = loader.run(inputs);
    if (outputs.empty()) throw std::runtime_error("the model returned no outputs");
    write_tensor(argv[3], outputs[0]);
    std::cout << "input " << inputs[0].sizes() << " -> output " << outputs[0].sizes() << "\n";
  } catch (const std::exception& err) {
    std::cerr << "aoti_loader: " << err.what() << "\n";
    return 1;
  }
  return 0;
}
