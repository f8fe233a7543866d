/* Building instances of slotted classes from values already checked, in C, for a rebuild's hot path.
 *
 * Optional, like rlmm/_avro_reader.c: setup.py builds it when a C compiler is there. rlmm.types.slot_maker uses it
 * for the frozen dataclasses a rebuild builds per record (a segment, its id, its UUID, its key, an epoch's lineage),
 * which Python builds as object.__new__ and one object.__setattr__ per field: about 0.2 us a field, most of a
 * decoded record's cost. A maker does the same (no __init__, no __post_init__, no __setattr__) in one call.
 *
 *   maker(cls, fields) -> make(*values)   make builds a cls with each named slot set to its value, in order
 *
 * maker raises TypeError unless every field is a plain object slot of cls (a member descriptor of cls or of a base
 * of it, as __slots__ makes), named once; make raises TypeError unless given exactly one value per field.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

/* The maker's state, the `self` of each make call: the class and its slots' offsets in field order. */
typedef struct {
    PyTypeObject *cls;
    Py_ssize_t count;
    Py_ssize_t offsets[];
} Spec;

static void
spec_free(PyObject *capsule)
{
    Spec *spec = PyCapsule_GetPointer(capsule, "rlmm._slots.spec");
    if (spec != NULL) {
        Py_DECREF(spec->cls);
        PyMem_Free(spec);
    }
}

static PyObject *
make(PyObject *capsule, PyObject *const *args, Py_ssize_t nargs)
{
    Spec *spec = PyCapsule_GetPointer(capsule, "rlmm._slots.spec");
    if (spec == NULL) {
        return NULL;
    }
    if (nargs != spec->count) {
        PyErr_Format(PyExc_TypeError, "%s maker takes %zd values, got %zd", spec->cls->tp_name, spec->count, nargs);
        return NULL;
    }
    PyObject *object = spec->cls->tp_alloc(spec->cls, 0);
    if (object == NULL) {
        return NULL;
    }
    /* A new object's slots are NULL, and maker refused a field named twice: nothing to release. */
    for (Py_ssize_t i = 0; i < nargs; i++) {
        *(PyObject **)((char *)object + spec->offsets[i]) = Py_NewRef(args[i]);
    }
    return object;
}

static PyMethodDef make_def = {
    "make", (PyCFunction)(void (*)(void))make, METH_FASTCALL,
    PyDoc_STR("make(*values) -> an instance with its slots set to the values, in the maker's field order"),
};

/* maker(cls, fields) -> make: see the module's comment. */
static PyObject *
slots_maker(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyTuple_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "maker(cls: type, fields: tuple[str, ...])");
        return NULL;
    }
    PyTypeObject *cls = (PyTypeObject *)args[0];
    PyObject *fields = args[1];
    Py_ssize_t count = PyTuple_GET_SIZE(fields);
    if (cls->tp_alloc == NULL || (cls->tp_flags & Py_TPFLAGS_IS_ABSTRACT)) {
        PyErr_Format(PyExc_TypeError, "%s cannot be allocated", cls->tp_name);
        return NULL;
    }
    Spec *spec = PyMem_Malloc(sizeof(Spec) + (size_t)count * sizeof(Py_ssize_t));
    if (spec == NULL) {
        return PyErr_NoMemory();
    }
    spec->cls = cls;
    spec->count = count;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        PyObject *descriptor = PyUnicode_CheckExact(name) ? PyObject_GetAttr((PyObject *)cls, name) : NULL;
        if (descriptor == NULL) {
            PyErr_Clear();
        }
        int plain = descriptor != NULL && Py_IS_TYPE(descriptor, &PyMemberDescr_Type)
                    && PyType_IsSubtype(cls, PyDescr_TYPE(descriptor))
                    && ((PyMemberDescrObject *)descriptor)->d_member->type == T_OBJECT_EX
                    && !(((PyMemberDescrObject *)descriptor)->d_member->flags & READONLY);
        spec->offsets[i] = plain ? ((PyMemberDescrObject *)descriptor)->d_member->offset : -1;
        Py_XDECREF(descriptor);
        for (Py_ssize_t j = 0; plain && j < i; j++) {
            plain = spec->offsets[j] != spec->offsets[i];
        }
        if (!plain) {
            PyMem_Free(spec);
            PyErr_Format(PyExc_TypeError, "%R is not a slot of %s named once", name, cls->tp_name);
            return NULL;
        }
    }
    Py_INCREF(cls);
    PyObject *capsule = PyCapsule_New(spec, "rlmm._slots.spec", spec_free);
    if (capsule == NULL) {
        Py_DECREF(cls);
        PyMem_Free(spec);
        return NULL;
    }
    PyObject *function = PyCFunction_New(&make_def, capsule);
    Py_DECREF(capsule);
    return function;
}

static PyMethodDef slots_methods[] = {
    {"maker", (PyCFunction)(void (*)(void))slots_maker, METH_FASTCALL,
     PyDoc_STR("maker(cls, fields) -> make(*values), building a cls with its slots set, without __init__")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef slots_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._slots",
    .m_doc = PyDoc_STR("Builds instances of slotted classes from checked values in C (optional; rlmm.types builds "
                       "them in Python without it)."),
    .m_size = -1,
    .m_methods = slots_methods,
};

PyMODINIT_FUNC
PyInit__slots(void)
{
    return PyModule_Create(&slots_module);
}
