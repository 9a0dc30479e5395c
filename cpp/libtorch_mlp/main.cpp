// libtorch_mlp: train, save, load and run the course's digits MLP in C++, without Python.
//
//   libtorch_mlp train DATA_DIR WEIGHTS.pt [--epochs N] [--lr LR] [--batch B] [--seed S]
//                      [--hidden H] [--depth D] [--threads T]
//   libtorch_mlp infer WEIGHTS.pt INPUT.bin OUTPUT.bin
//
// `train` reads x_train.bin, y_train.bin, x_test.bin and y_test.bin from DATA_DIR, trains the MLP
// with torch::optim::Adam and autograd, prints one line per epoch and the test accuracy, and saves
// the weights with torch::pickle_save: a file Python reads with torch.load(path, weights_only=True),
// (name, tensor) pairs with the names Python's state_dict uses ("net.0.weight", ...).
// `infer` loads such a file, rebuilds the model from the tensors' shapes and writes the model's
// output (logits) for INPUT.bin under torch::InferenceMode.
//
// The .bin files use the course's plain tensor format (course_utils/deploy/aoti_cpp.py, shared
// with cpp/aoti_loader): 8 bytes of magic "AOTITNSR", an int64 count of dimensions n, n int64
// sizes, then float32 values in row-major order; little-endian. Labels travel as float32 too
// (small integers are exact in float32) and become int64 here.
//
// Output lines are meant for people and for course_utils/deploy/libtorch_cpp.py, which reads them:
//   epoch 3 loss 0.123456789 seconds 0.0421
//   test accuracy 441/450

#include <torch/torch.h>

#include "tensor_file.h"  // the course's tensor file format (cpp/common)

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

using course::read_tensor;
using course::write_tensor;

namespace {

// ---- the model: course_utils/models/mlp.py, in C++ ----------------------------------------

// `depth` hidden layers of Linear -> LayerNorm -> GELU, then a Linear output layer, all inside a
// Sequential registered as "net": parameter names come out as in Python ("net.0.weight", ...).
struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t in_features, int64_t hidden, int64_t out_features, int64_t depth) {
    if (depth < 1) throw std::invalid_argument("depth must be at least 1");
    int64_t width = in_features;
    for (int64_t i = 0; i < depth; ++i) {
      net->push_back(torch::nn::Linear(width, hidden));
      net->push_back(torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden})));
      net->push_back(torch::nn::GELU());
      width = hidden;
    }
    net->push_back(torch::nn::Linear(width, out_features));
    register_module("net", net);
  }

  torch::Tensor forward(const torch::Tensor& x) { return net->forward(x); }

  torch::nn::Sequential net;
};
TORCH_MODULE(MLP);  // MLP is a shared pointer to an MLPImpl, as torch::nn's own modules are

// ---- saving and loading weights ----------------------------------------------------------

// torch::pickle_save writes the zip archive Python's torch.save writes, so Python reads it with
// torch.load(path, weights_only=True), as long as it holds only what that safe loader allows. A
// c10::Dict or c10::List would not do: the C++ pickler wraps every dict and list in a call to
// torch.jit._pickle.restore_type_tag (to record its element types), a global the safe loader
// refuses. Tuples, strings and tensors carry no such tag, so we save a tuple of
// (name, tensor) pairs, in the order of named_parameters(); Python turns it into a state dict
// with dict(...).
void save_weights(const MLP& model, const std::string& path) {
  std::vector<c10::IValue> pairs;
  for (const auto& item : model->named_parameters())
    pairs.emplace_back(c10::ivalue::Tuple::create(item.key(), item.value().detach().clone()));
  const std::vector<char> bytes = torch::pickle_save(c10::ivalue::Tuple::create(std::move(pairs)));
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("failed writing " + path);
}

// The inverse of save_weights: a tuple of (name, tensor) pairs back into a name -> tensor dict.
c10::Dict<std::string, torch::Tensor> load_weights(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const c10::IValue value = torch::pickle_load(bytes);
  if (!value.isTuple()) throw std::runtime_error(path + " does not hold a tuple of (name, tensor) pairs");
  c10::Dict<std::string, torch::Tensor> weights;
  for (const c10::IValue& pair : value.toTupleRef().elements()) {
    if (!pair.isTuple() || pair.toTupleRef().elements().size() != 2)
      throw std::runtime_error(path + " does not hold a tuple of (name, tensor) pairs");
    const auto& name_and_tensor = pair.toTupleRef().elements();
    weights.insert(name_and_tensor[0].toStringRef(), name_and_tensor[1].toTensor());
  }
  return weights;
}

// Rebuild the MLP from the weights' shapes: net.0.weight is (hidden, in); the last Linear's weight
// is (out, hidden); there is one LayerNorm per hidden layer.
MLP model_from_weights(const c10::Dict<std::string, torch::Tensor>& weights) {
  int64_t linear_layers = 0;
  for (const auto& item : weights) linear_layers += item.value().dim() == 2;
  if (linear_layers < 2 || !weights.contains("net.0.weight")) throw std::runtime_error("not an MLP's weights");
  const torch::Tensor first = weights.at("net.0.weight");
  const torch::Tensor last = weights.at("net." + std::to_string(3 * (linear_layers - 1)) + ".weight");
  MLP model(first.size(1), first.size(0), last.size(0), linear_layers - 1);
  torch::NoGradGuard no_grad;  // copying into parameters is not part of any computation to differentiate
  for (auto& item : model->named_parameters()) {
    if (!weights.contains(item.key())) throw std::runtime_error("the weights lack " + item.key());
    const torch::Tensor source = weights.at(item.key());
    if (source.sizes() != item.value().sizes()) throw std::runtime_error("wrong shape for " + item.key());
    item.value().copy_(source);
  }
  return model;
}

// ---- training ----------------------------------------------------------------------------

struct Options {
  int64_t epochs = 10, batch = 64, seed = 0, hidden = 128, depth = 2, threads = 0;
  double lr = 1e-3;
};

int64_t count_correct(MLP& model, const torch::Tensor& x, const torch::Tensor& y) {
  torch::InferenceMode inference;  // no autograd bookkeeping while evaluating
  return model->forward(x).argmax(1).eq(y).sum().item<int64_t>();
}

int train(const std::string& data_dir, const std::string& weights_path, const Options& opt) {
  if (opt.threads > 0) torch::set_num_threads(static_cast<int>(opt.threads));
  torch::manual_seed(opt.seed);  // the same seed gives the same initial weights as in Python
  const torch::Tensor x_train = read_tensor(data_dir + "/x_train.bin").flatten(1);
  const torch::Tensor y_train = read_tensor(data_dir + "/y_train.bin").to(torch::kLong);
  const torch::Tensor x_test = read_tensor(data_dir + "/x_test.bin").flatten(1);
  const torch::Tensor y_test = read_tensor(data_dir + "/y_test.bin").to(torch::kLong);
  if (x_train.size(0) != y_train.size(0) || x_test.size(0) != y_test.size(0))
    throw std::runtime_error("images and labels differ in number");
  const int64_t classes = y_train.max().item<int64_t>() + 1;

  MLP model(x_train.size(1), opt.hidden, classes, opt.depth);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(opt.lr));
  const int64_t n = x_train.size(0);
  std::cout << std::fixed;
  for (int64_t epoch = 1; epoch <= opt.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    model->train();
    const torch::Tensor order = torch::randperm(n);  // a new shuffle every epoch
    double total = 0.0;
    for (int64_t i = 0; i < n; i += opt.batch) {
      const torch::Tensor idx = order.slice(0, i, std::min(i + opt.batch, n));
      const torch::Tensor loss = torch::nn::functional::cross_entropy(
          model->forward(x_train.index_select(0, idx)), y_train.index_select(0, idx));
      optimizer.zero_grad();
      loss.backward();  // autograd fills every parameter's .grad
      optimizer.step();
      total += loss.item<double>() * static_cast<double>(idx.size(0));
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    // twelve decimals, so the notebook can compare the loss with Python's well below float32 rounding
    std::cout << "epoch " << epoch << " loss " << std::setprecision(12) << total / static_cast<double>(n)
              << " seconds " << std::setprecision(4) << took.count() << std::endl;
  }
  model->eval();
  std::cout << "test accuracy " << count_correct(model, x_test, y_test) << "/" << x_test.size(0) << std::endl;
  save_weights(model, weights_path);
  std::cout << "saved " << weights_path << std::endl;
  return 0;
}

// ---- inference ---------------------------------------------------------------------------

int infer(const std::string& weights_path, const std::string& input_path, const std::string& output_path) {
  MLP model = model_from_weights(load_weights(weights_path));
  model->eval();
  torch::InferenceMode inference;  // tensors made here carry no autograd history at all
  const torch::Tensor x = read_tensor(input_path);
  const torch::Tensor out = model->forward(x.flatten(1));
  write_tensor(output_path, out);
  std::cout << "input " << x.sizes() << " -> output " << out.sizes() << std::endl;
  return 0;
}

int64_t to_int(const std::string& flag, const std::string& text) {
  size_t used = 0;
  const long long value = std::stoll(text, &used);
  if (used != text.size()) throw std::invalid_argument(flag + " needs a whole number, got " + text);
  return value;
}

Options parse_options(int argc, char** argv, int first) {
  Options opt;
  for (int i = first; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--epochs") opt.epochs = to_int(flag, value);
    else if (flag == "--batch") opt.batch = to_int(flag, value);
    else if (flag == "--seed") opt.seed = to_int(flag, value);
    else if (flag == "--hidden") opt.hidden = to_int(flag, value);
    else if (flag == "--depth") opt.depth = to_int(flag, value);
    else if (flag == "--threads") opt.threads = to_int(flag, value);
    else if (flag == "--lr") opt.lr = std::stod(value);
    else throw std::invalid_argument("unknown option " + flag);
  }
  if (opt.epochs < 1 || opt.batch < 1 || opt.hidden < 1 || opt.depth < 1 || !(opt.lr > 0))
    throw std::invalid_argument("epochs, batch, hidden, depth and lr must be positive");
  return opt;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = std::string("usage: ") + argv[0] +
      " train DATA_DIR WEIGHTS.pt [--epochs N] [--lr LR] [--batch B] [--seed S] [--hidden H] [--depth D]"
      " [--threads T]\n       " + argv[0] + " infer WEIGHTS.pt INPUT.bin OUTPUT.bin\n";
  try {
    const std::string command = argc > 1 ? argv[1] : "";
    if (command == "train" && argc >= 4) return train(argv[2], argv[3], parse_options(argc, argv, 4));
    if (command == "infer" && argc == 5) return infer(argv[2], argv[3], argv[4]);
    std::cerr << usage;
    return 2;
  } catch (const std::exception& err) {
    std::cerr << "libtorch_mlp: " << err.what() << "\n";
    return 1;
  }
}
