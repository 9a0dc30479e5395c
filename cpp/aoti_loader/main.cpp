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

#include "tensor_file.h"  // the course's tensor file format (cpp/common)

#include <array>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

using course::read_tensor;
using course::write_tensor;

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
