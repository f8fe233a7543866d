/* Kafka's record batches (magic 2) read in C, for a worker's raw read of the metadata topic (rlmm.raw_fetch).
 *
 * Optional, like the other extensions: setup.py builds it when a C compiler is there, and rlmm/record_batches.py is
 * its reference (tests/native/fuzz_record_batches.py checks that they agree on any bytes). librdkafka's consumer
 * hands Python one Message object per record, about 1.3 us each: most of a rebuild's read of the topic. This reads
 * the bytes a Fetch response holds for a partition into (offset, key, value) tuples in one pass.
 *
 *   read(data: bytes, start: int, end: int, decompress) -> (records: list, next_offset: int, transactional: bool)
 *
 * The records of the whole batches in data with offsets in [start, end); the offset after the last whole batch (-1
 * when none is whole); whether it stopped at a transactional or control batch. decompress(codec, payload) gives a
 * compressed batch's records as bytes. TypeError for arguments of other types; ValueError for bytes that do not frame
 * exactly, with the reference's message.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

#define HEADER_BYTES 61
#define MAGIC 2
#define CODEC_MASK 0x07
#define TRANSACTIONAL 0x10
#define CONTROL 0x20
#define MAX_BASE_OFFSET (INT64_MAX - ((int64_t)1 << 36))

static int64_t
be64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return (int64_t)v;
}

static int32_t
be32(const unsigned char *p)
{
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

/* A zigzag varint of at most `most` bytes (5 or 10) at *at, below limit; *at moves past it. -1 with ValueError set
 * when it is cut short or runs past `most` bytes. */
static int
varint(const unsigned char *data, Py_ssize_t limit, Py_ssize_t *at, int most, int64_t *out)
{
    uint64_t raw = 0;
    for (int i = 0; i < most; i++) {
        if (*at + i >= limit) {
            PyErr_SetString(PyExc_ValueError, "a number is cut short");
            return -1;
        }
        unsigned char byte = data[*at + i];
        if (i < 10) {
            raw |= (i * 7 < 64) ? ((uint64_t)(byte & 0x7F) << (i * 7)) : 0;
        }
        if (!(byte & 0x80)) {
            *at += i + 1;
            *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            return 0;
        }
    }
    PyErr_Format(PyExc_ValueError, "a number runs past %d bytes", most);
    return -1;
}

/* A key, value or header part: a new reference (Py_None for length -1) in *out; -1 with an error set. */
static int
part(const unsigned char *data, Py_ssize_t size, Py_ssize_t *at, Py_ssize_t limit, PyObject **out)
{
    int64_t length;
    if (varint(data, size, at, 5, &length) < 0) {
        return -1;
    }
    if (length == -1) {
        *out = Py_NewRef(Py_None);
        return 0;
    }
    if (length < 0 || *at + length > limit) {
        PyErr_Format(PyExc_ValueError, "a key, value or header of %lld bytes runs past its record",
                     (long long)length);
        return -1;
    }
    *out = PyBytes_FromStringAndSize((const char *)data + *at, (Py_ssize_t)length);
    if (*out == NULL) {
        return -1;
    }
    *at += (Py_ssize_t)length;
    return 0;
}

/* The records of one batch's body, appended to `records` when their offsets are in [start, end). */
static int
records_of(const unsigned char *body, Py_ssize_t size, int64_t base, int32_t count, int64_t start, int64_t end,
           PyObject *records)
{
    Py_ssize_t at = 0;
    for (int32_t n = 0; n < count; n++) {
        int64_t length, timestamp, delta, headers;
        if (varint(body, size, &at, 5, &length) < 0) {
            return -1;
        }
        if (length < 0 || at + length > size) {
            PyErr_Format(PyExc_ValueError, "a record of batch %lld says it holds %lld bytes, past its batch",
                         (long long)base, (long long)length);
            return -1;
        }
        Py_ssize_t record_end = at + (Py_ssize_t)length;
        at += 1; /* attributes */
        if (varint(body, size, &at, 10, &timestamp) < 0 || varint(body, size, &at, 5, &delta) < 0) {
            return -1;
        }
        PyObject *key = NULL, *value = NULL;
        if (part(body, size, &at, record_end, &key) < 0) {
            return -1;
        }
        if (part(body, size, &at, record_end, &value) < 0 || varint(body, size, &at, 5, &headers) < 0) {
            Py_DECREF(key);
            Py_XDECREF(value);
            return -1;
        }
        if (headers < 0) {
            PyErr_Format(PyExc_ValueError, "a record of batch %lld says it holds %lld headers", (long long)base,
                         (long long)headers);
            goto failed;
        }
        for (int64_t h = 0; h < headers; h++) {
            PyObject *name = NULL, *header_value = NULL;
            if (part(body, size, &at, record_end, &name) < 0) {
                goto failed;
            }
            if (name == Py_None) {
                Py_DECREF(name);
                PyErr_Format(PyExc_ValueError, "a record of batch %lld holds a header without a name",
                             (long long)base);
                goto failed;
            }
            Py_DECREF(name);
            if (part(body, size, &at, record_end, &header_value) < 0) {
                goto failed;
            }
            Py_DECREF(header_value);
        }
        if (at != record_end) {
            PyErr_Format(PyExc_ValueError, "a record of batch %lld holds %zd bytes more than it frames",
                         (long long)base, record_end - at);
            goto failed;
        }
        int64_t offset = base + delta; /* base <= MAX_BASE_OFFSET and |delta| < 2**35: no overflow */
        if (offset >= start && offset < end) {
            PyObject *offset_object = PyLong_FromLongLong(offset);
            if (offset_object == NULL) {
                goto failed;
            }
            PyObject *record = PyTuple_New(3);
            if (record == NULL) {
                Py_DECREF(offset_object);
                goto failed;
            }
            PyTuple_SET_ITEM(record, 0, offset_object); /* the tuple takes each reference */
            PyTuple_SET_ITEM(record, 1, key);
            PyTuple_SET_ITEM(record, 2, value);
            int appended = PyList_Append(records, record);
            Py_DECREF(record);
            if (appended < 0) {
                return -1;
            }
        }
        else {
            Py_DECREF(key);
            Py_DECREF(value);
        }
        continue;
    failed:
        Py_DECREF(key);
        Py_DECREF(value);
        return -1;
    }
    if (at != size) {
        PyErr_Format(PyExc_ValueError, "batch %lld holds %zd bytes after its %d records", (long long)base, size - at,
                     (int)count);
        return -1;
    }
    return 0;
}

static PyObject *
batches_read(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyBytes_CheckExact(args[0]) || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2])
        || !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "read(data: bytes, start: int, end: int, decompress: callable)");
        return NULL;
    }
    int64_t start = PyLong_AsLongLong(args[1]);
    int64_t end = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "read: start and end must be int64 offsets");
        return NULL;
    }
    PyObject *data = args[0], *decompress = args[3];
    const unsigned char *bytes = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data), at = 0;
    int64_t next_offset = -1;
    int transactional = 0;
    PyObject *records = PyList_New(0);
    if (records == NULL) {
        return NULL;
    }
    while (size - at >= 12) {
        const unsigned char *batch = bytes + at;
        int64_t base = be64(batch);
        int32_t length = be32(batch + 8);
        if (length < HEADER_BYTES - 12) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld says it holds %d bytes, fewer than its header",
                         (long long)base, (int)length);
            goto failed;
        }
        if (size - at - 12 < length) {
            break; /* cut at the fetch's byte limit: the next fetch reads it whole */
        }
        int magic = (signed char)batch[16];
        int attributes = (int16_t)(((unsigned)batch[21] << 8) | batch[22]);
        int32_t last_delta = be32(batch + 23);
        int32_t count = be32(batch + 57);
        if (base < 0 || base > MAX_BASE_OFFSET) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld: not an offset this reader takes (0..%lld)",
                         (long long)base, (long long)MAX_BASE_OFFSET);
            goto failed;
        }
        if (magic != MAGIC) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld of magic %d; this reader reads magic %d",
                         (long long)base, magic, MAGIC);
            goto failed;
        }
        if (attributes & (TRANSACTIONAL | CONTROL)) {
            transactional = 1;
            break;
        }
        if (count < 0 || last_delta < 0) {
            PyErr_Format(PyExc_ValueError, "a batch at offset %lld of %d records, last offset delta %d",
                         (long long)base, (int)count, (int)last_delta);
            goto failed;
        }
        const unsigned char *body = batch + HEADER_BYTES;
        Py_ssize_t body_size = 12 + (Py_ssize_t)length - HEADER_BYTES;
        int codec = attributes & CODEC_MASK;
        int read;
        if (codec) {
            PyObject *payload = PyBytes_FromStringAndSize((const char *)body, body_size);
            if (payload == NULL) {
                goto failed;
            }
            PyObject *unpacked = PyObject_CallFunction(decompress, "iO", codec, payload);
            Py_DECREF(payload);
            if (unpacked == NULL) {
                goto failed;
            }
            if (!PyBytes_CheckExact(unpacked)) {
                PyErr_Format(PyExc_ValueError, "a batch at offset %lld: decompressed to %s, not bytes",
                             (long long)base, Py_TYPE(unpacked)->tp_name);
                Py_DECREF(unpacked);
                goto failed;
            }
            /* Held until its records are read: the tuples hold copies of their parts. */
            read = records_of((const unsigned char *)PyBytes_AS_STRING(unpacked), PyBytes_GET_SIZE(unpacked), base,
                              count, start, end, records);
            Py_DECREF(unpacked);
        }
        else {
            read = records_of(body, body_size, base, count, start, end, records);
        }
        if (read < 0) {
            goto failed;
        }
        next_offset = base + last_delta + 1;
        at += 12 + (Py_ssize_t)length;
    }
    return Py_BuildValue("(NLO)", records, (long long)next_offset, transactional ? Py_True : Py_False);
failed:
    Py_DECREF(records);
    return NULL;
}

/* The text `<topic id>:<partition>` of a record key (rlmm.events.RecordKey), as a new bytes object: before a segment
 * key's id (":" and 36 characters), else the key's second and third fields; rlmm.record_batches.partition_text is its
 * reference. NULL with an exception only when memory runs out. */
static PyObject *
partition_text(PyObject *raw_key)
{
    const char *key = PyBytes_AS_STRING(raw_key);
    Py_ssize_t length = PyBytes_GET_SIZE(raw_key);
    if (length > 45 && memcmp(key, "segment:", 8) == 0 && key[length - 37] == ':') {
        return PyBytes_FromStringAndSize(key + 8, length - 45);
    }
    const char *first = memchr(key, ':', (size_t)length);
    if (first == NULL) {
        return PyBytes_FromStringAndSize("", 0);
    }
    const char *end = key + length;
    const char *second = memchr(first + 1, ':', (size_t)(end - first - 1));
    const char *third = second == NULL ? NULL : memchr(second + 1, ':', (size_t)(end - second - 1));
    return PyBytes_FromStringAndSize(first + 1, (third == NULL ? end : third) - first - 1);
}

/* Whether the user partition `key` names is in `first`, or it names none (1), or not (0); -1 with an exception.
 * `named` remembers each partition's text: text -> its view key, or None; `name(text)` names one not there. */
static int
in_first(PyObject *key, PyObject *first, PyObject *named, PyObject *name)
{
    PyObject *text = partition_text(key);
    if (text == NULL) {
        return -1;
    }
    PyObject *tp_key = PyDict_GetItemWithError(named, text);  /* borrowed */
    if (tp_key != NULL) {
        Py_INCREF(tp_key);
    } else if (!PyErr_Occurred()) {
        tp_key = PyObject_CallOneArg(name, text);
        if (tp_key != NULL && PyDict_SetItem(named, text, tp_key) < 0) {
            Py_CLEAR(tp_key);
        }
    }
    Py_DECREF(text);
    if (tp_key == NULL) {
        return -1;
    }
    int found = tp_key == Py_None ? 1 : PySet_Contains(first, tp_key);
    Py_DECREF(tp_key);
    return found;
}

/* keep(newest, superseded_tombstones, partition, records, expected, cleaned, tombstone_prefix, only=None)
 *     -> (expected, cleaned)
 *
 * rlmm.record_batches.keep (its reference) in C: the newest record of each key of `records`, consecutive records of
 * one metadata partition, as a rebuild's compacted window keeps them; with `only` = (first, named, name, wanted), only
 * the records whose key's user partition is in `first` (or names none: `in_first`) if `wanted`, else the others. */
static PyObject *
batches_keep(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *only = nargs == 8 ? args[7] : Py_None;
    if ((nargs != 7 && nargs != 8) || !PyDict_CheckExact(args[0]) || !PyList_CheckExact(args[1])
        || !PyLong_CheckExact(args[2]) || !PyList_CheckExact(args[3]) || !PyLong_CheckExact(args[4])
        || !PyBool_Check(args[5]) || !PyBytes_CheckExact(args[6])
        || (only != Py_None && (!PyTuple_CheckExact(only) || PyTuple_GET_SIZE(only) != 4
                                || !PyAnySet_CheckExact(PyTuple_GET_ITEM(only, 0))
                                || !PyDict_CheckExact(PyTuple_GET_ITEM(only, 1))
                                || !PyCallable_Check(PyTuple_GET_ITEM(only, 2))
                                || !PyBool_Check(PyTuple_GET_ITEM(only, 3))))) {
        PyErr_SetString(PyExc_TypeError, "keep(newest: dict, superseded_tombstones: list, partition: int, records: "
                                         "list, expected: int, cleaned: bool, tombstone_prefix: bytes, only: "
                                         "(first: set, named: dict, name, wanted: bool) | None = None)");
        return NULL;
    }
    PyObject *newest = args[0], *superseded = args[1], *partition = args[2], *records = args[3];
    PyObject *prefix = args[6];
    /* Held: `name` may run any Python code. */
    PyObject *first = NULL, *named = NULL, *name = NULL;
    int wanted = 0;
    if (only != Py_None) {
        first = PyTuple_GET_ITEM(only, 0);
        named = PyTuple_GET_ITEM(only, 1);
        name = PyTuple_GET_ITEM(only, 2);
        wanted = PyTuple_GET_ITEM(only, 3) == Py_True;
    }
    int cleaned = args[5] == Py_True;
    int overflow = 0;
    long long expected = PyLong_AsLongLongAndOverflow(args[4], &overflow);
    if (overflow || (expected == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "expected: not an offset (int64)");
        return NULL;
    }
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0);
    if (empty == NULL) {
        return NULL;
    }
    Py_INCREF(only);
    const char *prefix_data = PyBytes_AS_STRING(prefix);
    Py_ssize_t prefix_size = PyBytes_GET_SIZE(prefix);
    /* The list is read by index each time round: a dict's key comparison below can run Python code. */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 3 || !PyLong_CheckExact(PyTuple_GET_ITEM(record, 0))) {
            PyErr_Format(PyExc_TypeError, "record %zd: not an (offset, key, value) tuple", i);
            goto failed;
        }
        Py_INCREF(record);
        PyObject *offset_object = PyTuple_GET_ITEM(record, 0), *key = PyTuple_GET_ITEM(record, 1);
        PyObject *value = PyTuple_GET_ITEM(record, 2);
        long long offset = PyLong_AsLongLongAndOverflow(offset_object, &overflow);
        if (overflow || (offset == -1 && PyErr_Occurred()) || offset == LLONG_MAX
            || !(key == Py_None || PyBytes_CheckExact(key)) || !(value == Py_None || PyBytes_CheckExact(value))) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "record %zd: its offset is not below int64's greatest, or its key or "
                                          "value is neither bytes nor None", i);
            Py_DECREF(record);
            goto failed;
        }
        if (offset != expected) {
            cleaned = 1;
        }
        expected = offset + 1;
        if (key == Py_None) {
            key = empty;
        }
        if (first != NULL) {
            int found = in_first(key, first, named, name);
            if (found != wanted) {
                Py_DECREF(record);
                if (found < 0) {
                    goto failed;
                }
                continue;
            }
        }
        if (value == Py_None && PyBytes_GET_SIZE(key) >= prefix_size
            && memcmp(PyBytes_AS_STRING(key), prefix_data, (size_t)prefix_size) == 0) {
            int held = PyDict_Contains(newest, key);
            int failed_here = held < 0 || (held > 0 && PyDict_DelItem(newest, key) < 0);
            Py_DECREF(record);
            if (failed_here) {
                goto failed;
            }
            continue;
        }
        PyObject *before = PyDict_GetItemWithError(newest, key);  /* borrowed */
        if (before == NULL && PyErr_Occurred()) {
            Py_DECREF(record);
            goto failed;
        }
        int after_cleaning = cleaned;
        if (before != NULL) {
            if (!PyTuple_CheckExact(before) || PyTuple_GET_SIZE(before) < 4) {
                PyErr_SetString(PyExc_TypeError, "newest holds an entry that is not a kept record's tuple");
                Py_DECREF(record);
                goto failed;
            }
            after_cleaning = PyTuple_GET_ITEM(before, 3) != Py_None;
            if (!after_cleaning && PyList_Append(superseded, before) < 0) {
                Py_DECREF(record);
                goto failed;
            }
        }
        PyObject *entry = PyTuple_Pack(6, partition, offset_object, key, value, Py_None,
                                       after_cleaning ? Py_True : Py_False);
        Py_DECREF(record);
        if (entry == NULL) {
            goto failed;
        }
        int stored = PyDict_SetItem(newest, key, entry);
        Py_DECREF(entry);
        if (stored < 0) {
            goto failed;
        }
    }
    Py_DECREF(empty);
    Py_DECREF(only);
    return Py_BuildValue("(LO)", expected, cleaned ? Py_True : Py_False);
failed:
    Py_DECREF(empty);
    Py_DECREF(only);
    return NULL;
}

static PyMethodDef batches_methods[] = {
    {"read", (PyCFunction)(void (*)(void))batches_read, METH_FASTCALL,
     PyDoc_STR("read(data, start, end, decompress) -> (records, next_offset, transactional): the (offset, key, "
               "value) records of a Fetch response's whole batches for one partition")},
    {"keep", (PyCFunction)(void (*)(void))batches_keep, METH_FASTCALL,
     PyDoc_STR("keep(newest, superseded_tombstones, partition, records, expected, cleaned, tombstone_prefix, only=None) -> "
               "(expected, cleaned): the newest record of each key of records, as a compacted window keeps them")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef batches_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._record_batches",
    .m_doc = PyDoc_STR("Reads Kafka record batches in C (optional; rlmm.record_batches reads them in Python "
                       "without it)."),
    .m_size = -1,
    .m_methods = batches_methods,
};

PyMODINIT_FUNC
PyInit__record_batches(void)
{
    return PyModule_Create(&batches_module);
}
