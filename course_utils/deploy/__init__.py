"""Deployment helpers: run an exported model outside eager PyTorch.

- ``onnx_tools``: the course's MiniLM as an ONNX file, and ONNX Runtime sessions to run it.
- ``cmake_build``: build the course's C++ programs (``cpp/<name>``) with CMake against the installed
  torch, run them, list the shared libraries they load.
- ``tensor_file``: the plain tensor file format the C++ programs read and write.
- ``aoti_cpp``: build and run the C++ AOTInductor loader (``cpp/aoti_loader``) from Python.
- ``libtorch_cpp``: build and run the LibTorch trainer (``cpp/libtorch_mlp``): train, save, load, infer.

Import the modules themselves (``from course_utils.deploy import onnx_tools``); nothing is imported here.
"""
