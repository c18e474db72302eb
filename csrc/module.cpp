// `import nostall._C` loads this library, whose static initialisers register the operators.
// It defines no Python functions: everything is reached through torch.ops.nostall.
#include <Python.h>

extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C", "nostall native operators (see torch.ops.nostall)", -1, nullptr,
  };
  return PyModule_Create(&module_def);
}
}
