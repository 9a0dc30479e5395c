"""Deployment helpers: run an exported model outside eager PyTorch.

- ``onnx_tools``: the course's MiniLM as an ONNX file, and ONNX Runtime sessions to run it.
- ``aoti_cpp``: build and run the C++ AOTInductor loader (``cpp/aoti_loader``) from Python.

Import the modules themselves (``from course_utils.deploy import onnx_tools``); nothing is imported here.
"""
