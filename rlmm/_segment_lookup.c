/* The broker's fetch-path lookup (RemoteLogMetadataManager.remote_log_segment_metadata) for a partition already found
 * readable, in C: the same steps as the method's lock-free path, without the interpreter's per-step cost.
 *
 * Optional: setup.py builds it when a C compiler is there, and rlmm.manager falls back to the method alone when it
 * is missing. A SegmentLookup answers only what the lock-free path answers; anything else (another type of
 * argument, a negative or huge number, a partition not yet readable, halted or deleted, keyword arguments) goes to
 * the Python method it was given, which makes every check and raises every error. So both paths answer alike by
 * construction, and tests/rlmm/test_rlmm_native_lookup.py checks it on random states.
 *
 * What it reads, all kept current by the manager and the read model (rlmm/manager.py, rlmm/read_model.py):
 *   readable_now: dict (topic id as int, partition) -> _Readable (topic, metadata_partition, snapshot)
 *   halted:       dict metadata partition -> error
 *   snapshot:     PartitionSnapshot (deleted, sole_epoch, sole_segments, sole_bounds, floors)
 *   floors:       EpochFloors (segments: tuple, bounds: array('q') of the n starts then the n ends)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *readable_now; /* dict, never replaced (cleared in place on close) */
    PyObject *halted;       /* dict, never replaced */
    PyObject *tp_type;      /* rlmm.types.TopicIdPartition: only that exact type takes this path */
    PyObject *fallback;     /* the Python method: every call this path does not answer */
    vectorcallfunc vectorcall;
} SegmentLookup;

static PyObject *str_topic_id, *str_int, *str_partition, *str_topic, *str_metadata_partition, *str_snapshot,
    *str_deleted, *str_sole_epoch, *str_sole_segments, *str_sole_bounds, *str_floors, *str_segments, *str_bounds;

/* A plain int in [0, 2**63): its value; else -1 (the caller then leaves the call to the fallback). */
static long long
plain_non_negative(PyObject *value)
{
    if (!PyLong_CheckExact(value)) {
        return -1;
    }
    int overflow = 0;
    long long result = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || result < 0) {
        PyErr_Clear();
        return -1;
    }
    return result;
}

/* The floor of `offset` among (segments, bounds): the entry with the greatest start <= offset, if offset <= its end;
 * else None (EpochFloors.floor). A new reference, or NULL with an error set. */
static PyObject *
floor_of(PyObject *segments, PyObject *bounds, long long offset)
{
    if (!PyTuple_CheckExact(segments)) {
        PyErr_SetString(PyExc_TypeError, "EpochFloors.segments must be a tuple");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(bounds, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(segments);
    if (view.itemsize != (Py_ssize_t)sizeof(long long) || view.format == NULL || view.format[0] != 'q'
        || view.len < 2 * count * (Py_ssize_t)sizeof(long long)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "EpochFloors.bounds must be an array('q') of the starts, then the ends");
        return NULL;
    }
    const long long *starts = (const long long *)view.buf;
    Py_ssize_t low = 0, high = count; /* bisect_right over the starts */
    while (low < high) {
        Py_ssize_t middle = low + (high - low) / 2;
        if (offset < starts[middle]) {
            high = middle;
        }
        else {
            low = middle + 1;
        }
    }
    PyObject *found = (low && offset <= starts[count + low - 1]) ? PyTuple_GET_ITEM(segments, low - 1) : Py_None;
    PyBuffer_Release(&view);
    return Py_NewRef(found);
}

/* The answer from a readable partition's snapshot, or NULL with no error set when the fallback must answer. */
static PyObject *
answer(SegmentLookup *self, PyObject *readable, PyObject *tp, PyObject *epoch, long long offset)
{
    PyObject *theirs = PyObject_GetAttr(readable, str_topic);
    PyObject *ours = theirs == NULL ? NULL : PyObject_GetAttr(tp, str_topic);
    int same = ours == NULL ? -1 : PyObject_RichCompareBool(theirs, ours, Py_EQ);
    Py_XDECREF(theirs);
    Py_XDECREF(ours);
    if (same <= 0) {
        return NULL;
    }
    if (PyDict_GET_SIZE(self->halted) > 0) {
        PyObject *partition = PyObject_GetAttr(readable, str_metadata_partition);
        int halted = partition == NULL ? -1 : PyDict_Contains(self->halted, partition);
        Py_XDECREF(partition);
        if (halted != 0) {
            return NULL;
        }
    }
    PyObject *snapshot = PyObject_GetAttr(readable, str_snapshot);
    if (snapshot == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *segments = NULL, *bounds = NULL;
    PyObject *deleted = PyObject_GetAttr(snapshot, str_deleted);
    if (deleted == NULL || deleted != Py_False) { /* deleted, or not a plain bool: the fallback decides */
        Py_XDECREF(deleted);
        goto done;
    }
    Py_DECREF(deleted);
    PyObject *sole_epoch = PyObject_GetAttr(snapshot, str_sole_epoch);
    if (sole_epoch == NULL) {
        goto done;
    }
    int sole = PyObject_RichCompareBool(epoch, sole_epoch, Py_EQ);
    Py_DECREF(sole_epoch);
    if (sole < 0) {
        goto done;
    }
    if (sole) {
        segments = PyObject_GetAttr(snapshot, str_sole_segments);
        bounds = segments == NULL ? NULL : PyObject_GetAttr(snapshot, str_sole_bounds);
    }
    else {
        PyObject *floors_by_epoch = PyObject_GetAttr(snapshot, str_floors);
        if (floors_by_epoch == NULL || !PyDict_CheckExact(floors_by_epoch)) {
            Py_XDECREF(floors_by_epoch);
            goto done;
        }
        PyObject *floors = PyDict_GetItemWithError(floors_by_epoch, epoch); /* borrowed */
        Py_XINCREF(floors);
        Py_DECREF(floors_by_epoch);
        if (floors == NULL) {
            if (!PyErr_Occurred()) {
                result = Py_NewRef(Py_None); /* no floors in that epoch: nothing to find */
            }
            goto done;
        }
        segments = PyObject_GetAttr(floors, str_segments);
        bounds = segments == NULL ? NULL : PyObject_GetAttr(floors, str_bounds);
        Py_DECREF(floors);
    }
    if (bounds != NULL) {
        result = floor_of(segments, bounds, offset);
    }
done:
    Py_XDECREF(segments);
    Py_XDECREF(bounds);
    Py_DECREF(snapshot);
    if (result == NULL) {
        PyErr_Clear(); /* whatever went wrong here, the fallback meets it again and says what it is */
    }
    return result;
}

static PyObject *
segment_lookup_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SegmentLookup *self = (SegmentLookup *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs == 3 && kwnames == NULL && (PyObject *)Py_TYPE(args[0]) == self->tp_type) {
        PyObject *tp = args[0];
        long long epoch = plain_non_negative(args[1]);
        long long offset = epoch < 0 ? -1 : plain_non_negative(args[2]);
        if (offset >= 0) {
            PyObject *topic_id = PyObject_GetAttr(tp, str_topic_id);
            PyObject *id = topic_id == NULL ? NULL : PyObject_GetAttr(topic_id, str_int);
            PyObject *partition = id == NULL ? NULL : PyObject_GetAttr(tp, str_partition);
            PyObject *key = partition == NULL ? NULL : PyTuple_Pack(2, id, partition);
            Py_XDECREF(topic_id);
            Py_XDECREF(id);
            Py_XDECREF(partition);
            PyObject *readable = key == NULL ? NULL : PyDict_GetItemWithError(self->readable_now, key); /* borrowed */
            Py_XDECREF(key);
            if (readable != NULL) {
                Py_INCREF(readable); /* a concurrent stop may drop the dict's reference */
                PyObject *found = answer(self, readable, tp, args[1], offset);
                Py_DECREF(readable);
                if (found != NULL) {
                    return found;
                }
            }
            PyErr_Clear();
        }
    }
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
segment_lookup_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"readable_now", "halted", "tp_type", "fallback", NULL};
    PyObject *readable_now, *halted, *tp_type, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!O:SegmentLookup", keywords, &PyDict_Type, &readable_now,
                                     &PyDict_Type, &halted, &PyType_Type, &tp_type, &fallback)) {
        return NULL;
    }
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "SegmentLookup: fallback must be callable");
        return NULL;
    }
    SegmentLookup *self = (SegmentLookup *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->readable_now = Py_NewRef(readable_now);
    self->halted = Py_NewRef(halted);
    self->tp_type = Py_NewRef(tp_type);
    self->fallback = Py_NewRef(fallback);
    self->vectorcall = segment_lookup_vectorcall;
    return (PyObject *)self;
}

static int
segment_lookup_traverse(SegmentLookup *self, visitproc visit, void *arg)
{
    Py_VISIT(self->readable_now);
    Py_VISIT(self->halted);
    Py_VISIT(self->tp_type);
    Py_VISIT(self->fallback);
    return 0;
}

static int
segment_lookup_clear(SegmentLookup *self)
{
    Py_CLEAR(self->readable_now);
    Py_CLEAR(self->halted);
    Py_CLEAR(self->tp_type);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
segment_lookup_dealloc(SegmentLookup *self)
{
    PyObject_GC_UnTrack(self);
    segment_lookup_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef segment_lookup_members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(SegmentLookup, vectorcall), READONLY, NULL},
    {"fallback", T_OBJECT, offsetof(SegmentLookup, fallback), READONLY, "the method answering the rest"},
    {NULL},
};

static PyTypeObject SegmentLookupType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlmm._segment_lookup.SegmentLookup",
    .tp_doc = PyDoc_STR("SegmentLookup(readable_now, halted, tp_type, fallback): "
                        "called as fallback(tp, leader_epoch, offset), answering a readable partition's lookup in C"),
    .tp_basicsize = sizeof(SegmentLookup),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = segment_lookup_new,
    .tp_traverse = (traverseproc)segment_lookup_traverse,
    .tp_clear = (inquiry)segment_lookup_clear,
    .tp_dealloc = (destructor)segment_lookup_dealloc,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(SegmentLookup, vectorcall),
    .tp_members = segment_lookup_members,
};

static struct PyModuleDef segment_lookup_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._segment_lookup",
    .m_doc = PyDoc_STR("The fetch path's segment lookup in C (optional; rlmm.manager falls back to Python)."),
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__segment_lookup(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&str_topic_id, "topic_id"}, {&str_int, "int"}, {&str_partition, "partition"}, {&str_topic, "topic"},
        {&str_metadata_partition, "metadata_partition"}, {&str_snapshot, "snapshot"}, {&str_deleted, "deleted"},
        {&str_sole_epoch, "sole_epoch"}, {&str_sole_segments, "sole_segments"}, {&str_sole_bounds, "sole_bounds"},
        {&str_floors, "floors"}, {&str_segments, "segments"}, {&str_bounds, "bounds"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL) {
            return NULL;
        }
    }
    if (PyType_Ready(&SegmentLookupType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&segment_lookup_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "SegmentLookup", (PyObject *)&SegmentLookupType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
