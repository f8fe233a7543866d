/* The most common record of a rebuild folded in C, for a fold worker's lean fold (rlmm.lean_fold).
 *
 * Optional, like the other extensions: setup.py builds it when a C compiler is there, and LeanFold._segment_record is
 * its reference (tests/native/fuzz_lean_fold.py checks that they agree). Nearly every record a rebuild folds is a
 * segment's COPY_SEGMENT_FINISHED with one leader epoch, of a segment its partition does not hold, starting after
 * every segment indexed in that epoch. The Python fold of such a record is about 2.5 us, most of a worker's fold.
 *
 *   finished(lean, named, ruled, new, offset, raw_key, datum, value, skipped_before) -> (int, int) | None
 *
 * The arguments are LeanFold's: its partitions held leanly (dict), the user partitions named so far (dict of (topic id
 * text, topic, partition) -> (TopicIdPartition, key) or None), the partitions the rules fold (set), its `_new`, and
 * `_segment_record`'s. For a record of that form whose partition is named already, it folds the record as
 * `_segment_record` does and returns the partition's key. For anything else it changes nothing and returns None, and
 * `_segment_record` judges the record: so None never means "not plain", only "not taken here". TypeError for
 * arguments of other types; an exception from a call it makes (`new`, a dict, the allocator) is raised as it is.
 *
 *   rows(key, segments, index) -> (segment keys, segment values, index keys, index values)
 *
 * A partition held leanly as its entries of the view's segments and epoch_index families (LeanFold.runs; `_rows` is
 * its reference, which tests/native/fuzz_lean_fold.py holds it to): `key` + each segment id, ascending as bytes
 * compare, with its record's bytes; `key` + each epoch (big-endian int32) + each entry's start (big-endian int64),
 * epochs ascending and each epoch's entries as listed, with the entry's segment id. Building them in Python was a
 * fifth of a worker's time in a rebuild. TypeError for containers, ids or numbers of other types, OverflowError for
 * a number its packing cannot hold.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define DATUM_FIELDS 14
#define SEGMENT_TEXT 36

static PyObject *segments_name, *index_name, *highest_name, *owed_name, *position_name;

/* 1 with *out set for an int (exactly) within int64; 0 for anything else. */
static int
plain_int(PyObject *object, long long *out)
{
    if (!PyLong_CheckExact(object)) {
        return 0;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = value;
    return 1;
}

/* Each byte's value as a hex digit, or -1: a table, as an id's digits are random (a branch per digit mispredicts). */
static signed char hex_values[256];

static void
fill_hex_values(void)
{
    memset(hex_values, -1, sizeof hex_values);
    for (int i = 0; i < 10; i++) {
        hex_values['0' + i] = (signed char)i;
    }
    for (int i = 0; i < 6; i++) {
        hex_values['a' + i] = hex_values['A' + i] = (signed char)(10 + i);
    }
}

/* The 16 bytes of a segment id's canonical text (8-4-4-4-12 hex digits), or 0 when it is not that. */
static int
segment_bytes(const char *text, Py_ssize_t length, unsigned char out[16])
{
    static const unsigned char starts[16] = {0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34};
    if (length != SEGMENT_TEXT || text[8] != '-' || text[13] != '-' || text[18] != '-' || text[23] != '-') {
        return 0;
    }
    int bad = 0;
    for (int i = 0; i < 16; i++) {
        int high = hex_values[(unsigned char)text[starts[i]]], low = hex_values[(unsigned char)text[starts[i] + 1]];
        bad |= high | low;  /* -1 sets the sign bit */
        out[i] = (unsigned char)(((unsigned)high << 4) | (unsigned)low);
    }
    return bad >= 0;
}

/* Whether raw_key is exactly "segment:<topic id>:<partition>:<segment id>" (the key rlmm.codec writes). */
static int
key_matches(PyObject *raw_key, const char *topic_id, Py_ssize_t topic_id_length, long long partition,
            const char *segment, Py_ssize_t segment_length)
{
    char number[24];
    int number_length = 0;
    unsigned long long magnitude = partition < 0 ? 0ULL - (unsigned long long)partition : (unsigned long long)partition;
    char digits[24];
    int count = 0;
    do {
        digits[count++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (partition < 0) {
        number[number_length++] = '-';
    }
    while (count) {
        number[number_length++] = digits[--count];
    }
    const char *key = PyBytes_AS_STRING(raw_key);
    Py_ssize_t length = PyBytes_GET_SIZE(raw_key);
    if (length != 8 + topic_id_length + 1 + number_length + 1 + segment_length) {
        return 0;
    }
    if (memcmp(key, "segment:", 8) != 0 || memcmp(key + 8, topic_id, (size_t)topic_id_length) != 0) {
        return 0;
    }
    key += 8 + topic_id_length;
    if (key[0] != ':' || memcmp(key + 1, number, (size_t)number_length) != 0 || key[1 + number_length] != ':') {
        return 0;
    }
    return memcmp(key + 2 + number_length, segment, (size_t)segment_length) == 0;
}

/* A held partition's field, of the type the fold keeps there (a new reference), or NULL: with an exception set when
 * reading it raised, without one when it is of another type. */
static PyObject *
field_of(PyObject *held, PyObject *name, int is_set)
{
    PyObject *field = PyObject_GetAttr(held, name);
    if (field == NULL) {
        return NULL;
    }
    if (is_set ? !PySet_CheckExact(field) : !PyDict_CheckExact(field)) {
        Py_DECREF(field);
        return NULL;
    }
    return field;
}

/* A held partition's four fields (new references): 1; 0 when one is of another type; -1 with an exception set. */
static int
fields_of(PyObject *held, PyObject **segments, PyObject **index, PyObject **highest, PyObject **owed)
{
    *segments = field_of(held, segments_name, 0);
    *index = *segments == NULL ? NULL : field_of(held, index_name, 0);
    *highest = *index == NULL ? NULL : field_of(held, highest_name, 0);
    *owed = *highest == NULL ? NULL : field_of(held, owed_name, 1);
    if (*owed != NULL) {
        return 1;
    }
    return PyErr_Occurred() ? -1 : 0;
}

/* `finished` once its containers are checked: the partition's key (a new reference), None, or NULL with an exception. */
static PyObject *
finish_one(PyObject *lean, PyObject *named_all, PyObject *ruled, PyObject *new_partition, PyObject *offset,
           PyObject *raw_key, PyObject *datum, PyObject *value, PyObject *skipped_before)
{
    if (!PyLong_CheckExact(offset) || !PyBytes_CheckExact(raw_key) || !PyTuple_CheckExact(datum)
        || PyTuple_GET_SIZE(datum) != DATUM_FIELDS || !PyBytes_CheckExact(value) || skipped_before == Py_False) {
        Py_RETURN_NONE;
    }
    PyObject *topic_text = PyTuple_GET_ITEM(datum, 0), *topic = PyTuple_GET_ITEM(datum, 1);
    PyObject *number = PyTuple_GET_ITEM(datum, 2), *segment_text = PyTuple_GET_ITEM(datum, 3);
    PyObject *listed = PyTuple_GET_ITEM(datum, 10), *target = PyTuple_GET_ITEM(datum, 12);
    long long partition, start, end, max_timestamp, broker, event_timestamp, size;
    if (!PyUnicode_CheckExact(topic_text) || !PyUnicode_CheckExact(topic) || !PyUnicode_CheckExact(segment_text)
        || !PyUnicode_CheckExact(target) || !PyList_CheckExact(listed) || PyList_GET_SIZE(listed) != 1
        || !plain_int(number, &partition) || !plain_int(PyTuple_GET_ITEM(datum, 4), &start)
        || !plain_int(PyTuple_GET_ITEM(datum, 5), &end) || !plain_int(PyTuple_GET_ITEM(datum, 6), &max_timestamp)
        || !plain_int(PyTuple_GET_ITEM(datum, 7), &broker) || !plain_int(PyTuple_GET_ITEM(datum, 8), &event_timestamp)
        || !plain_int(PyTuple_GET_ITEM(datum, 9), &size)
        || PyUnicode_CompareWithASCIIString(target, "COPY_SEGMENT_FINISHED") != 0) {
        Py_RETURN_NONE;
    }
    PyObject *entry = PyList_GET_ITEM(listed, 0);
    long long epoch, epoch_start;
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2 || !plain_int(PyTuple_GET_ITEM(entry, 0), &epoch)
        || !plain_int(PyTuple_GET_ITEM(entry, 1), &epoch_start)) {
        Py_RETURN_NONE;
    }
    /* values_plainly_in_range and the epoch's checks: outside them the rules judge the record. */
    if (!(0 <= start && start <= end && -1 <= max_timestamp && 0 <= broker && broker <= INT32_MAX
          && 0 <= event_timestamp && 0 <= size && size <= INT32_MAX && 0 <= epoch && epoch <= INT32_MAX
          && start <= epoch_start && epoch_start <= end)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t topic_id_length, segment_length;
    const char *topic_id_utf8 = PyUnicode_AsUTF8AndSize(topic_text, &topic_id_length);
    const char *segment_utf8 = topic_id_utf8 == NULL ? NULL : PyUnicode_AsUTF8AndSize(segment_text, &segment_length);
    if (segment_utf8 == NULL) {  /* text that UTF-8 cannot hold: the rules word it */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    unsigned char segment_id[16];
    if (!key_matches(raw_key, topic_id_utf8, topic_id_length, partition, segment_utf8, segment_length)
        || !segment_bytes(segment_utf8, segment_length, segment_id)) {
        Py_RETURN_NONE;
    }
    /* From here on Python code may run (a key's comparison in the dicts below, an attribute read), which could
     * change `listed`: what is read of it is held. */
    PyObject *epoch_object = PyTuple_GET_ITEM(entry, 0), *epoch_start_object = PyTuple_GET_ITEM(entry, 1);
    Py_INCREF(epoch_object);
    Py_INCREF(epoch_start_object);
    PyObject *tp = NULL, *key = NULL, *segment = NULL, *held = NULL, *segments = NULL, *index = NULL;
    PyObject *highest = NULL, *owed = NULL, *result = NULL, *entries = NULL;
    PyObject *name = PyTuple_Pack(3, topic_text, topic, number);
    if (name == NULL) {
        goto done;
    }
    PyObject *named = PyDict_GetItemWithError(named_all, name);  /* borrowed */
    Py_DECREF(name);
    if (named == NULL) {
        if (!PyErr_Occurred()) {
            result = Py_NewRef(Py_None);  /* not named yet: LeanFold._name names it */
        }
        goto done;
    }
    if (!PyTuple_CheckExact(named) || PyTuple_GET_SIZE(named) != 2) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    tp = Py_NewRef(PyTuple_GET_ITEM(named, 0));
    key = Py_NewRef(PyTuple_GET_ITEM(named, 1));  /* `named` may go with a call below */
    int ruled_now = PySet_GET_SIZE(ruled) ? PySet_Contains(ruled, key) : 0;
    if (ruled_now != 0) {
        if (ruled_now > 0) {
            result = Py_NewRef(Py_None);
        }
        goto done;
    }
    segment = PyBytes_FromStringAndSize((const char *)segment_id, 16);
    if (segment == NULL) {
        goto done;
    }
    held = PyDict_GetItemWithError(lean, key);
    if (held == NULL && PyErr_Occurred()) {
        goto done;
    }
    int found = held != NULL;
    if (found) {
        Py_INCREF(held);
    } else {
        held = PyObject_CallFunctionObjArgs(new_partition, key, tp, NULL);
        if (held == NULL) {
            goto done;
        }
    }
    int fields = fields_of(held, &segments, &index, &highest, &owed);
    if (fields <= 0) {
        if (fields == 0 && found) {
            result = Py_NewRef(Py_None);
        } else if (fields == 0) {
            PyErr_SetString(PyExc_TypeError, "new() gave a partition whose fields are not the fold's");
        }
        goto done;
    }
    if (found) {
        /* Everything checked before anything changes: a record declined here leaves the fold as it was. */
        int holds = PyDict_Contains(segments, segment);
        if (holds != 0) {
            if (holds > 0) {
                result = Py_NewRef(Py_None);  /* a segment it holds: the rules */
            }
            goto done;
        }
        entries = PyDict_GetItemWithError(index, epoch_object);
        if (entries == NULL && PyErr_Occurred()) {
            goto done;
        }
        Py_XINCREF(entries);  /* held: the comparison below may run Python code */
        if (entries != NULL && (!PyList_CheckExact(entries) || PyList_GET_SIZE(entries) > 0)) {
            PyObject *last = PyList_CheckExact(entries) ? PyList_GET_ITEM(entries, PyList_GET_SIZE(entries) - 1) : NULL;
            if (last == NULL || !PyTuple_CheckExact(last) || PyTuple_GET_SIZE(last) != 2) {
                result = Py_NewRef(Py_None);
                goto done;
            }
            Py_INCREF(last);
            int after = PyObject_RichCompareBool(PyTuple_GET_ITEM(last, 0), epoch_start_object, Py_GE);
            Py_DECREF(last);
            if (after != 0) {
                if (after > 0) {
                    result = Py_NewRef(Py_None);  /* it displaces or overwrites: the rules */
                }
                goto done;
            }
        }
    }
    /* The epoch's entries as found above (a list), or a new list. */
    if (entries == NULL) {
        PyObject *fresh_list = PyList_New(0);
        if (fresh_list == NULL) {
            goto done;
        }
        entries = PyDict_SetDefault(index, epoch_object, fresh_list);  /* borrowed */
        Py_DECREF(fresh_list);
        if (entries == NULL) {
            goto done;
        }
        Py_INCREF(entries);
        if (!PyList_CheckExact(entries)) {
            PyErr_SetString(PyExc_TypeError, "a held partition's index entries are not a list");
            goto done;
        }
    }
    if (PyDict_SetItem(segments, segment, value) < 0) {
        goto done;
    }
    PyObject *indexed = PyTuple_Pack(2, epoch_start_object, segment);
    if (indexed == NULL) {
        goto done;
    }
    int appended = PyList_Append(entries, indexed);
    Py_DECREF(indexed);
    if (appended < 0) {
        goto done;
    }
    PyObject *end_object = PyTuple_GET_ITEM(datum, 5);
    PyObject *before = PyDict_GetItemWithError(highest, epoch_object);  /* borrowed */
    if (before == NULL && PyErr_Occurred()) {
        goto done;
    }
    int raised = 1;
    if (before != NULL && before != Py_None) {  /* as `highest is None or highest < end` */
        Py_INCREF(before);
        raised = PyObject_RichCompareBool(before, end_object, Py_LT);
        Py_DECREF(before);
        if (raised < 0) {
            goto done;
        }
    }
    if (raised && (PyDict_SetItem(highest, epoch_object, end_object) < 0 || PySet_Add(owed, epoch_object) < 0)) {
        goto done;
    }
    if (PyObject_SetAttr(held, position_name, offset) < 0) {
        goto done;
    }
    result = Py_NewRef(key);
done:
    Py_XDECREF(entries);
    Py_XDECREF(owed);
    Py_XDECREF(highest);
    Py_XDECREF(index);
    Py_XDECREF(segments);
    Py_XDECREF(held);
    Py_XDECREF(segment);
    Py_XDECREF(key);
    Py_XDECREF(tp);
    Py_DECREF(epoch_start_object);
    Py_DECREF(epoch_object);
    return result;
}

static int
fold_containers_checked(PyObject *const *args)
{
    return PyDict_CheckExact(args[0]) && PyDict_CheckExact(args[1]) && PyAnySet_CheckExact(args[2])
        && PyCallable_Check(args[3]);
}

static PyObject *
lean_finished(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9 || !fold_containers_checked(args)) {
        PyErr_SetString(PyExc_TypeError, "finished(lean: dict, named: dict, ruled: set, new, offset, raw_key, datum, "
                                         "value, skipped_before)");
        return NULL;
    }
    return finish_one(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8]);
}

/* fold_run(lean, named, ruled, new, records, start, stop_at, touched, header, read, program, header_length)
 * -> (index, folded)
 *
 * `finished` over the window's records from `start` on (a list of (metadata partition, offset, raw_key, value,
 * request, skipped_before) tuples, rlmm.fresh_load's Record), each value read by `read(program, value,
 * header_length)` (rlmm._avro_reader.read): the records of the form it folds, one after another, without a Python
 * call per record. It stops at the first record it does not fold (another form, a request's, another header, a
 * metadata partition in `stop_at`, a value the reader refuses, or a read or fold that raised: the caller folds that
 * record, and meets its exception itself) and returns its index and how many it folded, each one's partition key
 * added to `touched`. An exception that is not an Exception (KeyboardInterrupt) is raised as it is. */
static PyObject *
lean_fold_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12 || !fold_containers_checked(args) || !PyList_CheckExact(args[4]) || !PyLong_CheckExact(args[5])
        || !(PyDict_CheckExact(args[6]) || PyAnySet_CheckExact(args[6])) || !PySet_CheckExact(args[7])
        || !PyBytes_CheckExact(args[8]) || !PyCallable_Check(args[9]) || !PyLong_CheckExact(args[11])) {
        PyErr_SetString(PyExc_TypeError, "fold_run(lean: dict, named: dict, ruled: set, new, records: list, start: int, "
                                         "stop_at: dict | set, touched: set, header: bytes, read, program, "
                                         "header_length: int)");
        return NULL;
    }
    PyObject *records = args[4], *stop_at = args[6], *touched = args[7], *header = args[8];
    Py_ssize_t index = PyLong_AsSsize_t(args[5]);
    if (index == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (index < 0) {
        PyErr_SetString(PyExc_ValueError, "fold_run: start is negative");
        return NULL;
    }
    const char *header_bytes = PyBytes_AS_STRING(header);
    Py_ssize_t header_size = PyBytes_GET_SIZE(header), folded = 0;
    PyObject *read_args[3] = {args[10], NULL, args[11]};
    /* The list may change under a call below (Python code may run in a comparison): its length is read each time,
     * and the record in hand is held. */
    for (; index < PyList_GET_SIZE(records); index++) {
        PyObject *record = PyList_GET_ITEM(records, index);
        if (!PyTuple_CheckExact(record) || PyTuple_GET_SIZE(record) != 6) {
            break;
        }
        PyObject *value = PyTuple_GET_ITEM(record, 3);
        if (PyTuple_GET_ITEM(record, 4) != Py_None || !PyBytes_CheckExact(value)
            || PyBytes_GET_SIZE(value) < header_size || memcmp(PyBytes_AS_STRING(value), header_bytes,
                                                                (size_t)header_size) != 0) {
            break;
        }
        Py_INCREF(record);
        int stop = PyDict_CheckExact(stop_at) ? PyDict_Contains(stop_at, PyTuple_GET_ITEM(record, 0))
                                              : PySet_Contains(stop_at, PyTuple_GET_ITEM(record, 0));
        PyObject *key = NULL;
        if (stop == 0) {
            read_args[1] = value;
            PyObject *datum = PyObject_Vectorcall(args[9], read_args, 3, NULL);
            if (datum != NULL) {
                key = finish_one(args[0], args[1], args[2], args[3], PyTuple_GET_ITEM(record, 1),
                                 PyTuple_GET_ITEM(record, 2), datum, value, PyTuple_GET_ITEM(record, 5));
                Py_DECREF(datum);
            }
            if (key != NULL && key != Py_None && PySet_Add(touched, key) < 0) {
                Py_CLEAR(key);
            }
        }
        Py_DECREF(record);
        if (key == NULL || key == Py_None) {
            Py_XDECREF(key);
            if (PyErr_Occurred()) {
                if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                    return NULL;
                }
                PyErr_Clear();  /* the caller folds this record and meets it */
            }
            break;
        }
        Py_DECREF(key);
        folded++;
    }
    return Py_BuildValue("(nn)", index, folded);
}

/* --- rows: a partition's entries of the segments and epoch_index families, in key order --------------------- */

typedef struct {
    PyObject *key;    /* a segment id (bytes) */
    PyObject *value;  /* its record's bytes */
} segment_row;

typedef struct {
    long long epoch;
    Py_ssize_t first, count;  /* its entries in the entries array */
} epoch_rows;

typedef struct {
    long long start;
    PyObject *segment;  /* bytes */
} index_row;

static int
compare_segment_rows(const void *a, const void *b)
{
    PyObject *x = ((const segment_row *)a)->key, *y = ((const segment_row *)b)->key;
    Py_ssize_t nx = PyBytes_GET_SIZE(x), ny = PyBytes_GET_SIZE(y);
    int c = memcmp(PyBytes_AS_STRING(x), PyBytes_AS_STRING(y), (size_t)(nx < ny ? nx : ny));
    return c != 0 ? c : (nx > ny) - (nx < ny);  /* as bytes compare: a prefix first */
}

static int
compare_epoch_rows(const void *a, const void *b)
{
    long long x = ((const epoch_rows *)a)->epoch, y = ((const epoch_rows *)b)->epoch;
    return (x > y) - (x < y);
}

/* key + the big-endian bytes of `number` (`width` of them), as a new bytes object. */
static PyObject *
key_with(const char *key, Py_ssize_t key_length, const long long *numbers, const int *widths, int count,
         PyObject *tail)
{
    Py_ssize_t length = key_length;
    for (int i = 0; i < count; i++) {
        length += widths[i];
    }
    if (tail != NULL) {
        length += PyBytes_GET_SIZE(tail);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, length);
    if (out == NULL) {
        return NULL;
    }
    char *at = PyBytes_AS_STRING(out);
    memcpy(at, key, (size_t)key_length);
    at += key_length;
    for (int i = 0; i < count; i++) {
        unsigned long long bits = (unsigned long long)numbers[i];
        for (int j = widths[i] - 1; j >= 0; j--) {
            at[j] = (char)(bits & 0xff);
            bits >>= 8;
        }
        at += widths[i];
    }
    if (tail != NULL) {
        memcpy(at, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
    }
    return out;
}

static PyObject *
lean_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || !PyDict_CheckExact(args[1]) || !PyDict_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "rows(key: bytes, segments: dict, index: dict)");
        return NULL;
    }
    PyObject *key = args[0], *segments = args[1], *index = args[2];
    const char *key_bytes = PyBytes_AS_STRING(key);
    Py_ssize_t key_length = PyBytes_GET_SIZE(key);
    Py_ssize_t n_segments = PyDict_GET_SIZE(segments), n_epochs = PyDict_GET_SIZE(index), n_entries = 0;
    segment_row *rows = NULL;
    epoch_rows *epochs = NULL;
    index_row *entries = NULL;
    Py_ssize_t held_rows = 0, held_entries = 0;
    PyObject *segment_keys = NULL, *segment_values = NULL, *index_keys = NULL, *index_values = NULL;
    PyObject *result = NULL;
    PyObject *dict_key, *dict_value;
    Py_ssize_t at;
    /* Everything is read and checked, and what is kept held, before any object is made: making one may run a
     * collection, and a finalizer could change the dicts. Until then no Python code runs. */
    at = 0;
    while (PyDict_Next(index, &at, &dict_key, &dict_value)) {
        if (!PyList_CheckExact(dict_value)) {
            PyErr_SetString(PyExc_TypeError, "rows: an epoch's index entries are not a list");
            return NULL;
        }
        n_entries += PyList_GET_SIZE(dict_value);
    }
    rows = PyMem_Malloc(sizeof(segment_row) * (size_t)(n_segments ? n_segments : 1));
    epochs = PyMem_Malloc(sizeof(epoch_rows) * (size_t)(n_epochs ? n_epochs : 1));
    entries = PyMem_Malloc(sizeof(index_row) * (size_t)(n_entries ? n_entries : 1));
    if (rows == NULL || epochs == NULL || entries == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    at = 0;
    while (PyDict_Next(segments, &at, &dict_key, &dict_value)) {
        if (held_rows == n_segments) {
            PyErr_SetString(PyExc_RuntimeError, "rows: the segments changed while they were read");
            goto done;
        }
        if (!PyBytes_CheckExact(dict_key) || !PyBytes_CheckExact(dict_value)) {
            PyErr_SetString(PyExc_TypeError, "rows: a segment's id or record is not bytes");
            goto done;
        }
        rows[held_rows].key = Py_NewRef(dict_key);
        rows[held_rows].value = Py_NewRef(dict_value);
        held_rows++;
    }
    at = 0;
    Py_ssize_t epoch_count = 0;
    while (PyDict_Next(index, &at, &dict_key, &dict_value)) {
        long long epoch;
        if (!plain_int(dict_key, &epoch) || epoch < INT32_MIN || epoch > INT32_MAX) {
            PyErr_SetString(PyLong_CheckExact(dict_key) ? PyExc_OverflowError : PyExc_TypeError,
                            "rows: an epoch is not an int within a signed 32-bit int");
            goto done;
        }
        if (epoch_count == n_epochs || held_entries + PyList_GET_SIZE(dict_value) > n_entries) {
            PyErr_SetString(PyExc_RuntimeError, "rows: the index changed while it was read");
            goto done;
        }
        epochs[epoch_count].epoch = epoch;
        epochs[epoch_count].first = held_entries;
        epochs[epoch_count].count = PyList_GET_SIZE(dict_value);
        epoch_count++;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dict_value); i++) {
            PyObject *entry = PyList_GET_ITEM(dict_value, i);
            long long start;
            if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2
                || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 1))) {
                PyErr_SetString(PyExc_TypeError, "rows: an index entry is not a (start, segment id) tuple");
                goto done;
            }
            if (!plain_int(PyTuple_GET_ITEM(entry, 0), &start)) {
                PyErr_SetString(PyLong_CheckExact(PyTuple_GET_ITEM(entry, 0)) ? PyExc_OverflowError : PyExc_TypeError,
                                "rows: an index entry's start is not an int within a signed 64-bit int");
                goto done;
            }
            entries[held_entries].start = start;
            entries[held_entries].segment = Py_NewRef(PyTuple_GET_ITEM(entry, 1));
            held_entries++;
        }
    }
    qsort(rows, (size_t)held_rows, sizeof(segment_row), compare_segment_rows);
    qsort(epochs, (size_t)epoch_count, sizeof(epoch_rows), compare_epoch_rows);
    segment_keys = PyList_New(held_rows);
    segment_values = PyList_New(held_rows);
    index_keys = PyList_New(held_entries);
    index_values = PyList_New(held_entries);
    if (segment_keys == NULL || segment_values == NULL || index_keys == NULL || index_values == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < held_rows; i++) {
        PyObject *made = key_with(key_bytes, key_length, NULL, NULL, 0, rows[i].key);
        if (made == NULL) {
            goto done;
        }
        PyList_SET_ITEM(segment_keys, i, made);
        PyList_SET_ITEM(segment_values, i, Py_NewRef(rows[i].value));
    }
    static const int widths[2] = {4, 8};
    Py_ssize_t out = 0;
    for (Py_ssize_t e = 0; e < epoch_count; e++) {
        for (Py_ssize_t i = epochs[e].first; i < epochs[e].first + epochs[e].count; i++) {
            long long numbers[2] = {epochs[e].epoch, entries[i].start};
            PyObject *made = key_with(key_bytes, key_length, numbers, widths, 2, NULL);
            if (made == NULL) {
                goto done;
            }
            PyList_SET_ITEM(index_keys, out, made);
            PyList_SET_ITEM(index_values, out, Py_NewRef(entries[i].segment));
            out++;
        }
    }
    result = PyTuple_Pack(4, segment_keys, segment_values, index_keys, index_values);
done:
    Py_XDECREF(segment_keys);
    Py_XDECREF(segment_values);
    Py_XDECREF(index_keys);
    Py_XDECREF(index_values);
    for (Py_ssize_t i = 0; i < held_rows; i++) {
        Py_DECREF(rows[i].key);
        Py_DECREF(rows[i].value);
    }
    for (Py_ssize_t i = 0; i < held_entries; i++) {
        Py_DECREF(entries[i].segment);
    }
    PyMem_Free(rows);
    PyMem_Free(epochs);
    PyMem_Free(entries);
    return result;
}

static PyMethodDef lean_fold_methods[] = {
    {"finished", (PyCFunction)(void (*)(void))lean_finished, METH_FASTCALL,
     PyDoc_STR("finished(lean, named, ruled, new, offset, raw_key, datum, value, skipped_before) -> the partition's "
               "key when the record was folded here, else None (nothing changed)")},
    {"fold_run", (PyCFunction)(void (*)(void))lean_fold_run, METH_FASTCALL,
     PyDoc_STR("fold_run(lean, named, ruled, new, records, start, stop_at, touched, header, read, program, "
               "header_length) -> (index of the first record not folded here, how many were)")},
    {"rows", (PyCFunction)(void (*)(void))lean_rows, METH_FASTCALL,
     PyDoc_STR("rows(key, segments, index) -> (segment keys, segment values, index keys, index values): a partition "
               "held leanly as its entries of the segments and epoch_index families, each in key order")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef lean_fold_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "rlmm._lean_fold",
    .m_doc = PyDoc_STR("Folds a rebuild's plain COPY_SEGMENT_FINISHED records in C (optional; rlmm.lean_fold folds "
                       "them in Python without it)."),
    .m_size = -1,
    .m_methods = lean_fold_methods,
};

PyMODINIT_FUNC
PyInit__lean_fold(void)
{
    if (segments_name == NULL) {
        fill_hex_values();
        segments_name = PyUnicode_InternFromString("segments");
        index_name = PyUnicode_InternFromString("index");
        highest_name = PyUnicode_InternFromString("highest");
        owed_name = PyUnicode_InternFromString("owed");
        position_name = PyUnicode_InternFromString("position");
        if (segments_name == NULL || index_name == NULL || highest_name == NULL || owed_name == NULL
            || position_name == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&lean_fold_module);
}
