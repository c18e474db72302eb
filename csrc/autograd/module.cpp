// The Python module of nostall._C_autograd; its kernels register through TORCH_LIBRARY_IMPL
// blocks in the other files of this folder when the library loads.
#include <Python.h>

extern "C" PyObject* PyInit__C_autograd(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C_autograd", "nostall autograd kernels", -1, nullptr,
  };
  return PyModule_Create(&module_def);
}
