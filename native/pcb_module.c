/* pyconcbench._native: the one file that speaks CPython.
 *
 * Thin wrappers: parse and check arguments, release the GIL around the blocking native work
 * only (re-taking it about every 100 ms to run Python's signal handlers, so Ctrl-C and
 * pytest-timeout interrupt a long load), and map errno to OSError, bad arguments to
 * ValueError.  Everything else lives in the pcb_*.c files.
 *
 * Every integer argument is read as a Python int and range-checked here (never through the
 * "I"/"K" formats, which wrap silently): a value outside its range is one ValueError naming
 * the argument, its range and the value; a value of another type, a TypeError.
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1 /* as Python 3.9/3.10 pyconfig.h defines it, unguarded */
#endif
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sched.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/un.h>

#include "pcb_echo.h"
#include "pcb_hist.h"
#include "pcb_load.h"
#include "pcb_probe.h"

/* Free-threaded CPython (3.13t+): the module declares Py_MOD_GIL_NOT_USED, so every object that
 * can be shared between threads guards its own state.  A Histogram holds its per-object lock
 * (a critical section, 3.13+; nothing to do with the GIL) in every method; a Load claims itself
 * atomically for the length of a call (see load_claim).  Before 3.13 the GIL does both. */
#ifndef Py_BEGIN_CRITICAL_SECTION
#define Py_BEGIN_CRITICAL_SECTION(op) {
#define Py_END_CRITICAL_SECTION() }
#define Py_BEGIN_CRITICAL_SECTION2(a, b) {
#define Py_END_CRITICAL_SECTION2() }
#endif

/* NAME(PARAMS): NAME_locked(ARGS) inside the object's critical section (its per-object lock). */
#define LOCKED_METHOD(name, params, args)      \
    static PyObject *name params               \
    {                                          \
        PyObject *r;                           \
        Py_BEGIN_CRITICAL_SECTION(self);       \
        r = name##_locked args;                \
        Py_END_CRITICAL_SECTION();             \
        return r;                              \
    }

typedef struct {
    PyTypeObject *load_type;
    PyTypeObject *hist_type;
} module_state;

static inline module_state *get_state(PyObject *module)
{
    return (module_state *)PyModule_GetState(module);
}

/* ---- GIL handling ----------------------------------------------------------------- */

typedef struct {
    PyThreadState *save;
} gil_ctx;

/* pcb_check_fn: take the GIL, run pending signal handlers, release it again. */
static int check_signals(void *arg)
{
    gil_ctx *g = arg;
    PyEval_RestoreThread(g->save);
    int r = PyErr_CheckSignals();
    g->save = PyEval_SaveThread();
    return r != 0;
}

/* ---- integer arguments ------------------------------------------------------------ */

/* Sets the one error of an integer outside lo..hi (obj is an int). */
static int int_out_of_range(const char *name, PyObject *obj, const char *lo, const char *hi)
{
    /* an int too long to print (Python's 4,300-digit limit) is named by its size instead */
    PyObject *nbits = PyObject_CallMethod(obj, "bit_length", NULL);
    long long bits = nbits ? PyLong_AsLongLong(nbits) : -1;
    Py_XDECREF(nbits);
    PyErr_Clear();
    if (bits > 256) /* beyond 77 digits: the size says enough */
        PyErr_Format(PyExc_ValueError, "%s: must be an int in %s .. %s, got one of %lld bits", name, lo, hi,
                     bits);
    else
        PyErr_Format(PyExc_ValueError, "%s: must be an int in %s .. %s, got %R", name, lo, hi, obj);
    return -1;
}

/* obj as a Python int (anything with __index__), or NULL with TypeError naming the argument. */
static PyObject *index_arg(PyObject *obj, const char *name)
{
    PyObject *idx = PyNumber_Index(obj);
    if (!idx && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: must be an int, got %.100s", name, Py_TYPE(obj)->tp_name);
    }
    return idx;
}

/* Reads an integer argument (anything with __index__) within lo..hi into *out.  Returns 0, or
 * -1 with ValueError (outside the range: names it and quotes the value) or TypeError (not an
 * integer). */
static int int_arg(PyObject *obj, const char *name, long long lo, long long hi, long long *out)
{
    PyObject *idx = index_arg(obj, name);
    if (!idx)
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(idx, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(idx);
        return -1;
    }
    if (overflow || v < lo || v > hi) {
        char los[32], his[32];
        snprintf(los, sizeof(los), "%lld", lo);
        snprintf(his, sizeof(his), "%lld", hi);
        int_out_of_range(name, idx, los, his);
        Py_DECREF(idx);
        return -1;
    }
    Py_DECREF(idx);
    *out = v;
    return 0;
}

/* The same for an unsigned 64-bit argument within lo..hi. */
static int uint_arg(PyObject *obj, const char *name, unsigned long long lo, unsigned long long hi,
                    unsigned long long *out)
{
    PyObject *idx = index_arg(obj, name);
    if (!idx)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(idx); /* OverflowError when < 0 or too big */
    int bad = v == (unsigned long long)-1 && PyErr_Occurred();
    if (bad && !PyErr_ExceptionMatches(PyExc_OverflowError)) {
        Py_DECREF(idx);
        return -1;
    }
    if (bad)
        PyErr_Clear();
    if (bad || v < lo || v > hi) {
        char los[32], his[32];
        snprintf(los, sizeof(los), "%llu", lo);
        snprintf(his, sizeof(his), "%llu", hi);
        int_out_of_range(name, idx, los, his);
        Py_DECREF(idx);
        return -1;
    }
    Py_DECREF(idx);
    *out = v;
    return 0;
}

/* ---- names ------------------------------------------------------------------------ */

static const char *const ERROR_NAMES[PCB_E_COUNT] = {
    [PCB_E_CONNECT_REFUSED] = "connect_refused",
    [PCB_E_CONNECT_OTHER] = "connect_other",
    [PCB_E_RESET] = "reset",
    [PCB_E_EOF] = "early_eof",
    [PCB_E_TIMEOUT] = "timeout",
    [PCB_E_MISMATCH] = "payload_mismatch",
    [PCB_E_IO] = "io",
};

static const char *status_name(int status)
{
    switch (status) {
    case PCB_OK: return "ok";
    case PCB_FAIL_CONNECT: return "connect";
    case PCB_FAIL_MISMATCH: return "payload_mismatch";
    case PCB_FAIL_STALL: return "stall";
    case PCB_FAIL_DEADLINE: return "deadline";
    case PCB_FAIL_ERRORS: return "errors";
    case PCB_FAIL_INTERRUPTED: return "interrupted";
    default: return "system";
    }
}

/* ---- Histogram ------------------------------------------------------------------- */

/* The one latency histogram of the project (pcb_hist.c), as a Python object: the engine hands
 * each phase's histogram over as one; echo merges a case's rounds with merge(), the ZeroMQ
 * family records its Python-timed latencies with record_many(); both ask percentiles() of the
 * same C code. */
typedef struct {
    PyObject_HEAD
    pcb_hist *h;
} HistObject;

/* A new, empty Histogram of `type`. */
static HistObject *hist_alloc(PyTypeObject *type)
{
    HistObject *self = (HistObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->h = PyMem_Malloc(sizeof(pcb_hist));
    if (!self->h) {
        Py_DECREF(self);
        PyErr_NoMemory();
        return NULL;
    }
    pcb_hist_reset(self->h);
    return self;
}

static PyObject *Hist_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if ((kwds && PyDict_GET_SIZE(kwds)) || (args && PyTuple_GET_SIZE(args))) {
        PyErr_SetString(PyExc_TypeError, "Histogram() takes no arguments");
        return NULL;
    }
    return (PyObject *)hist_alloc(type);
}

static void Hist_dealloc(HistObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyMem_Free(self->h);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

/* Reads an ascending list of percentiles in [0, 100]; returns its length or -1. */
static Py_ssize_t read_percentiles(PyObject *pcts, double **out)
{
    /* a private tuple: a list may change under us (an item's __float__, another thread) */
    PyObject *seq = PyObject_TypeCheck(pcts, &PyUnicode_Type) || PyObject_TypeCheck(pcts, &PyBytes_Type)
                        ? NULL
                        : PySequence_Tuple(pcts);
    if (!seq) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "percentiles must be a sequence of numbers");
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    double *p = PyMem_Malloc(sizeof(double) * (size_t)(n ? n : 1));
    if (!p) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        p[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (p[i] == -1.0 && PyErr_Occurred())
            goto fail;
        if (!(p[i] >= 0.0 && p[i] <= 100.0) || (i && p[i] < p[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "percentiles must be ascending, within 0..100");
            goto fail;
        }
    }
    Py_DECREF(seq);
    *out = p;
    return n;
fail:
    Py_DECREF(seq);
    PyMem_Free(p);
    return -1;
}

/* A value in ns from a Python int; -1 with an exception set when it is not one. */
static int read_ns(PyObject *obj, long long *v)
{
    *v = PyLong_AsLongLong(obj);
    if (*v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            *v = PCB_HIST_MAX_NS + 1; /* beyond any range: counted out of range */
            return 0;
        }
        return -1;
    }
    return 0;
}

/* OverflowError when adding `add` to the count `have` would pass 2**64-1 (the counts would
 * wrap); `what` says which call. */
static int refuse_wrap(uint64_t have, uint64_t add, const char *what)
{
    if (have <= UINT64_MAX - add)
        return 0;
    PyErr_Format(PyExc_OverflowError,
                 "%s: the histogram would hold more than 2**64-1 values (it holds %llu, adding %llu)",
                 what, (unsigned long long)have, (unsigned long long)add);
    return -1;
}

static int in_hist_range(long long v)
{
    return v >= PCB_HIST_MIN_NS && v <= PCB_HIST_MAX_NS;
}

PyDoc_STRVAR(Hist_record_doc,
"record(ns, count=1) -> bool\n\n"
"Records one latency (an int of nanoseconds) `count` times (1 .. 2**62).  False when it is\n"
"outside HIST_MIN_NS..HIST_MAX_NS: then it is counted in out_of_range, not in the percentiles.\n"
"OverflowError when a count of the histogram would pass 2**64-1.");

static PyObject *Hist_record_locked(HistObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"ns", "count", NULL};
    PyObject *value, *count_obj = NULL;
    unsigned long long count = 1;
    long long v;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O:record", kwlist, &value, &count_obj))
        return NULL;
    if (count_obj && uint_arg(count_obj, "count", 1, 1ULL << 62, &count) < 0)
        return NULL;
    if (read_ns(value, &v) < 0)
        return NULL;
    if (refuse_wrap(in_hist_range(v) ? self->h->total : self->h->out_of_range, count, "count") < 0)
        return NULL;
    return PyBool_FromLong(pcb_hist_record_n(self->h, v, count));
}

PyDoc_STRVAR(Hist_record_many_doc,
"record_many(values) -> int\n\n"
"Records every latency of an iterable of ints (ns); returns how many were in range.");

static PyObject *Hist_record_many_locked(HistObject *self, PyObject *values)
{
    PyObject *it = PyObject_GetIter(values);
    if (!it)
        return NULL;
    unsigned long long recorded = 0;
    PyObject *item;
    while ((item = PyIter_Next(it))) {
        long long v;
        int r = read_ns(item, &v);
        Py_DECREF(item);
        if (r == 0)
            r = refuse_wrap(in_hist_range(v) ? self->h->total : self->h->out_of_range, 1,
                            "record_many");
        if (r < 0) {
            Py_DECREF(it);
            return NULL;
        }
        recorded += pcb_hist_record(self->h, v);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLongLong(recorded);
}

PyDoc_STRVAR(Hist_merge_doc,
"merge(other) -> None\n\nAdds every count of another Histogram into this one (OverflowError, and\n"
"nothing added, when a count would pass 2**64-1).");

static PyObject *Hist_merge_locked(HistObject *self, HistObject *other)
{
    const pcb_hist *o = other->h;
    if (refuse_wrap(self->h->total, o->total, "merge") < 0 ||
        refuse_wrap(self->h->out_of_range, o->out_of_range, "merge") < 0)
        return NULL;
    pcb_hist_merge(self->h, o);
    Py_RETURN_NONE;
}

static PyObject *Hist_merge(HistObject *self, PyObject *other)
{
    PyObject *r;
    if (!PyObject_TypeCheck(other, Py_TYPE(self)))
        return PyErr_Format(PyExc_TypeError, "merge: needs a Histogram, got %.100s",
                            Py_TYPE(other)->tp_name);
    Py_BEGIN_CRITICAL_SECTION2(self, other);
    r = Hist_merge_locked(self, (HistObject *)other);
    Py_END_CRITICAL_SECTION2();
    return r;
}

PyDoc_STRVAR(Hist_percentiles_doc,
"percentiles(pcts) -> list of int\n\n"
"For each p of an ascending list within 0..100: the highest value of the bucket holding the\n"
"smallest recorded value with at least p % of the values at or below it, never beyond the exact\n"
"min and max (100 gives the exact max).  Zeros when nothing was recorded.");

static PyObject *Hist_percentiles_locked(HistObject *self, PyObject *pcts)
{
    double *p = NULL;
    Py_ssize_t n = read_percentiles(pcts, &p);
    if (n < 0)
        return NULL;
    int64_t *out = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    if (!out) {
        PyMem_Free(p);
        return PyErr_NoMemory();
    }
    pcb_hist_percentiles(self->h, p, out, (size_t)n);
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromLongLong(out[i]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, v);
    }
    PyMem_Free(p);
    PyMem_Free(out);
    return list;
}

PyDoc_STRVAR(Hist_buckets_doc,
"buckets() -> list of (highest ns, count)\n\nThe non-empty buckets, ascending.");

static PyObject *Hist_buckets_locked(HistObject *self, PyObject *Py_UNUSED(ignored))
{
    const pcb_hist *h = self->h;
    PyObject *buckets = PyList_New(0);
    if (!buckets)
        return NULL;
    for (int i = 0; i < PCB_HIST_BUCKETS; i++) {
        if (!h->counts[i])
            continue;
        PyObject *pair = Py_BuildValue("(LK)", (long long)pcb_hist_bucket_high(i),
                                       (unsigned long long)h->counts[i]);
        if (!pair || PyList_Append(buckets, pair) < 0) {
            Py_XDECREF(pair);
            Py_DECREF(buckets);
            return NULL;
        }
        Py_DECREF(pair);
    }
    return buckets;
}

#define PERCENTILE_COUNT 6
static const double PERCENTILES[PERCENTILE_COUNT] = {50.0, 90.0, 95.0, 99.0, 99.9, 100.0};
static const char *const PERCENTILE_KEYS[PERCENTILE_COUNT] = {"p50", "p90", "p95", "p99", "p99_9", "max"};

PyDoc_STRVAR(Hist_summary_doc,
"summary() -> dict\n\n"
"count, out_of_range, min, mean, p50, p90, p95, p99, p99_9, max (ns; zeros when empty).");

static PyObject *Hist_summary_locked(HistObject *self, PyObject *Py_UNUSED(ignored))
{
    const pcb_hist *h = self->h;
    int64_t out[PERCENTILE_COUNT];
    pcb_hist_percentiles(h, PERCENTILES, out, PERCENTILE_COUNT);
    PyObject *d = Py_BuildValue("{s:K,s:K,s:L,s:d}", "count", (unsigned long long)h->total,
                                "out_of_range", (unsigned long long)h->out_of_range, "min",
                                (long long)(h->total ? h->min : 0), "mean",
                                h->total ? h->sum / (double)h->total : 0.0);
    if (!d)
        return NULL;
    for (int i = 0; i < PERCENTILE_COUNT; i++) {
        PyObject *v = PyLong_FromLongLong(out[i]);
        if (!v || PyDict_SetItemString(d, PERCENTILE_KEYS[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

PyDoc_STRVAR(Hist_copy_doc, "copy() -> Histogram\n\nAn independent copy.");

static PyObject *Hist_copy_locked(HistObject *self, PyObject *Py_UNUSED(ignored))
{
    HistObject *c = hist_alloc(Py_TYPE(self));
    if (c)
        memcpy(c->h, self->h, sizeof(pcb_hist));
    return (PyObject *)c;
}

/* to_bytes/from_bytes: a histogram handed between processes of one build (the load engines of a
 * run), exactly: a tag, then the struct as it is in memory. */
#define HIST_TAG "PCBHIST1"
#define HIST_TAG_LEN 8

PyDoc_STRVAR(Hist_to_bytes_doc,
"to_bytes() -> bytes\n\nThe whole histogram (counts, min, max, sum) for Histogram.from_bytes in\n"
"another process of the same build: merging it there is exact.");

static PyObject *Hist_to_bytes_locked(HistObject *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = PyBytes_FromStringAndSize(NULL, HIST_TAG_LEN + sizeof(pcb_hist));
    if (!out)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    memcpy(p, HIST_TAG, HIST_TAG_LEN);
    memcpy(p + HIST_TAG_LEN, self->h, sizeof(pcb_hist));
    return out;
}

PyDoc_STRVAR(Hist_from_bytes_doc,
"from_bytes(data) -> Histogram\n\nA histogram from to_bytes() (of this build).  ValueError when the\n"
"data is not one: wrong tag or length, counts that do not add up, min/max outside the range.");

static PyObject *Hist_from_bytes(PyObject *cls, PyObject *data)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    pcb_hist h;
    const char *why = NULL;
    if (view.len != (Py_ssize_t)(HIST_TAG_LEN + sizeof(pcb_hist)) || memcmp(view.buf, HIST_TAG, HIST_TAG_LEN) != 0)
        why = "not a histogram of this build (wrong tag or length)";
    else {
        memcpy(&h, (const char *)view.buf + HIST_TAG_LEN, sizeof(pcb_hist));
        uint64_t total = 0;
        for (int i = 0; i < PCB_HIST_BUCKETS && !why; i++) {
            if (total + h.counts[i] < total)
                why = "its counts overflow";
            total += h.counts[i];
        }
        if (!why && total != h.total)
            why = "its counts do not add up to its total";
        else if (!why && h.total && (h.min < PCB_HIST_MIN_NS || h.max > PCB_HIST_MAX_NS || h.min > h.max ||
                                     !(h.sum >= 0) || h.sum > 1e30))
            why = "its min, max or sum are outside the histogram's range";
    }
    PyBuffer_Release(&view);
    if (why) {
        PyErr_Format(PyExc_ValueError, "Histogram.from_bytes: %s", why);
        return NULL;
    }
    HistObject *out = hist_alloc((PyTypeObject *)cls);
    if (out)
        memcpy(out->h, &h, sizeof(pcb_hist));
    return (PyObject *)out;
}

static PyObject *Hist_get_count_locked(HistObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->h->total);
}

static PyObject *Hist_get_out_of_range_locked(HistObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(self->h->out_of_range);
}

static PyObject *Hist_get_min_locked(HistObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->h->total ? self->h->min : 0);
}

static PyObject *Hist_get_max_locked(HistObject *self, void *Py_UNUSED(closure))
{
    return PyLong_FromLongLong(self->h->total ? self->h->max : 0);
}

static PyObject *Hist_get_mean_locked(HistObject *self, void *Py_UNUSED(closure))
{
    return PyFloat_FromDouble(self->h->total ? self->h->sum / (double)self->h->total : 0.0);
}

static PyObject *Hist_repr_locked(HistObject *self)
{
    const pcb_hist *h = self->h;
    return PyUnicode_FromFormat("<Histogram count=%llu min=%lld max=%lld out_of_range=%llu>",
                                (unsigned long long)h->total, (long long)(h->total ? h->min : 0),
                                (long long)(h->total ? h->max : 0),
                                (unsigned long long)h->out_of_range);
}

LOCKED_METHOD(Hist_record, (HistObject *self, PyObject *args, PyObject *kwds), (self, args, kwds))
LOCKED_METHOD(Hist_record_many, (HistObject *self, PyObject *values), (self, values))
LOCKED_METHOD(Hist_percentiles, (HistObject *self, PyObject *pcts), (self, pcts))
LOCKED_METHOD(Hist_buckets, (HistObject *self, PyObject *Py_UNUSED(ignored)), (self, NULL))
LOCKED_METHOD(Hist_summary, (HistObject *self, PyObject *Py_UNUSED(ignored)), (self, NULL))
LOCKED_METHOD(Hist_copy, (HistObject *self, PyObject *Py_UNUSED(ignored)), (self, NULL))
LOCKED_METHOD(Hist_to_bytes, (HistObject *self, PyObject *Py_UNUSED(ignored)), (self, NULL))
LOCKED_METHOD(Hist_get_count, (HistObject *self, void *Py_UNUSED(closure)), (self, NULL))
LOCKED_METHOD(Hist_get_out_of_range, (HistObject *self, void *Py_UNUSED(closure)), (self, NULL))
LOCKED_METHOD(Hist_get_min, (HistObject *self, void *Py_UNUSED(closure)), (self, NULL))
LOCKED_METHOD(Hist_get_max, (HistObject *self, void *Py_UNUSED(closure)), (self, NULL))
LOCKED_METHOD(Hist_get_mean, (HistObject *self, void *Py_UNUSED(closure)), (self, NULL))
LOCKED_METHOD(Hist_repr, (HistObject *self), (self))

static PyObject *Hist_deepcopy(HistObject *self, PyObject *Py_UNUSED(memo))
{
    return Hist_copy(self, NULL);
}

static PyMethodDef Hist_methods[] = {
    {"record", (PyCFunction)(void (*)(void))Hist_record, METH_VARARGS | METH_KEYWORDS, Hist_record_doc},
    {"record_many", (PyCFunction)Hist_record_many, METH_O, Hist_record_many_doc},
    {"merge", (PyCFunction)Hist_merge, METH_O, Hist_merge_doc},
    {"percentiles", (PyCFunction)Hist_percentiles, METH_O, Hist_percentiles_doc},
    {"buckets", (PyCFunction)Hist_buckets, METH_NOARGS, Hist_buckets_doc},
    {"summary", (PyCFunction)Hist_summary, METH_NOARGS, Hist_summary_doc},
    {"copy", (PyCFunction)Hist_copy, METH_NOARGS, Hist_copy_doc},
    {"to_bytes", (PyCFunction)Hist_to_bytes, METH_NOARGS, Hist_to_bytes_doc},
    {"from_bytes", (PyCFunction)Hist_from_bytes, METH_O | METH_CLASS, Hist_from_bytes_doc},
    {"__copy__", (PyCFunction)Hist_copy, METH_NOARGS, NULL},
    {"__deepcopy__", (PyCFunction)Hist_deepcopy, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Hist_getset[] = {
    {"count", (getter)Hist_get_count, NULL, "Values recorded (in range).", NULL},
    {"out_of_range", (getter)Hist_get_out_of_range, NULL, "Values outside the range, not recorded.", NULL},
    {"min", (getter)Hist_get_min, NULL, "Exact smallest value recorded (0 when empty).", NULL},
    {"max", (getter)Hist_get_max, NULL, "Exact largest value recorded (0 when empty).", NULL},
    {"mean", (getter)Hist_get_mean, NULL, "Mean of the values recorded (0.0 when empty).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Hist_slots[] = {
    {Py_tp_doc, "Histogram()\n\n"
                "Log-linear latency histogram in ns (native/pcb_hist.h): values HIST_MIN_NS ..\n"
                "HIST_MAX_NS, a reported value at most 1/2**HIST_SUB_BITS above the true one."},
    {Py_tp_new, Hist_new},
    {Py_tp_dealloc, Hist_dealloc},
    {Py_tp_methods, Hist_methods},
    {Py_tp_getset, Hist_getset},
    {Py_tp_repr, Hist_repr},
    {0, NULL},
};

static PyType_Spec Hist_spec = {
    .name = "pyconcbench._native.Histogram",
    .basicsize = sizeof(HistObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Hist_slots,
};

static PyObject *result_dict(const pcb_phase_result *res)
{
    PyObject *errors = PyDict_New();
    if (!errors)
        return NULL;
    for (int k = 0; k < PCB_E_COUNT; k++) {
        PyObject *v = PyLong_FromUnsignedLongLong(res->errors[k]);
        if (!v || PyDict_SetItemString(errors, ERROR_NAMES[k], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(errors);
            return NULL;
        }
        Py_DECREF(v);
    }
    return Py_BuildValue("{s:s,s:s,s:K,s:d,s:d,s:d,s:N,s:I,s:I,s:K,s:I,s:I,s:K,s:K,s:d,s:d}", "status",
                         status_name(res->status), "message", res->message, "completed",
                         (unsigned long long)res->completed, "elapsed", res->elapsed, "cpu_user",
                         res->cpu_user, "cpu_sys", res->cpu_sys, "errors", errors, "waiting",
                         res->waiting, "live", res->live, "bytes", (unsigned long long)res->bytes,
                         "unserved", res->unserved, "served", res->served, "sent",
                         (unsigned long long)res->sent, "late", (unsigned long long)res->late,
                         "lag_mean", res->lag_mean, "lag_max", res->lag_max);
}

/* ---- Load ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    pcb_load_spec spec;
    pcb_load *load;
    unsigned long owner; /* thread that opened it: phases must run there (CPU pinning) */
    int busy;            /* LOAD_IDLE, or the call that has claimed the load (load_claim): while
                            open() or phase() runs (GIL released, a signal handler running
                            inside it, or another thread of a free-threaded build) every other
                            method refuses */
} LoadObject;

enum { LOAD_IDLE, LOAD_INIT, LOAD_OPEN, LOAD_PHASE, LOAD_CLOSE };
static const char *const LOAD_CALLS[] = {"", "__init__", "open", "phase", "close"};

/* Claims the load for one call, atomically (a compare-and-swap: two threads of a free-threaded
 * build cannot both win); RuntimeError naming both calls when another holds it. */
static int load_claim(LoadObject *self, int call)
{
    int holder = LOAD_IDLE;
    if (__atomic_compare_exchange_n(&self->busy, &holder, call, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    PyErr_Format(PyExc_RuntimeError,
                 "Load.%s(): refused while Load.%s() runs (from another thread or a signal "
                 "handler); call it after that returns", LOAD_CALLS[call], LOAD_CALLS[holder]);
    return -1;
}

static void load_release(LoadObject *self)
{
    __atomic_store_n(&self->busy, LOAD_IDLE, __ATOMIC_RELEASE);
}

/* NAME(PARAMS): NAME_claimed(ARGS) with the load claimed for CALL; FAIL when it is busy. */
#define CLAIMED_METHOD(type, name, params, args, call, fail) \
    static type name params                                  \
    {                                                        \
        if (load_claim(self, call) < 0)                      \
            return fail;                                     \
        type r = name##_claimed args;                        \
        load_release(self);                                  \
        return r;                                            \
    }

/* Fills spec->addr from a loopback address; sets ValueError otherwise. */
static int parse_address(pcb_load_spec *spec, const char *family, const char *address,
                         long long port)
{
    memset(&spec->addr, 0, sizeof(spec->addr));
    if (strcmp(family, "unix") == 0) {
        struct sockaddr_un *un = (struct sockaddr_un *)&spec->addr;
        size_t len = strlen(address);
        if (len == 0 || len >= sizeof(un->sun_path)) {
            PyErr_Format(PyExc_ValueError, "address: UNIX socket path must be 1 to %zu bytes, got %zu",
                         sizeof(un->sun_path) - 1, len);
            return -1;
        }
        un->sun_family = AF_UNIX;
        memcpy(un->sun_path, address, len + 1);
        spec->addrlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
        return 0;
    }
    if (port < 1 || port > 65535) {
        PyErr_Format(PyExc_ValueError, "port: must be 1..65535, got %lld", port);
        return -1;
    }
    struct sockaddr_in *in4 = (struct sockaddr_in *)&spec->addr;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&spec->addr;
    if (strcmp(family, "tcp") == 0 && inet_pton(AF_INET, address, &in4->sin_addr) == 1) {
        if ((ntohl(in4->sin_addr.s_addr) >> 24) != 127) {
            PyErr_Format(PyExc_ValueError, "address: %s is not loopback (127.0.0.0/8, ::1)", address);
            return -1;
        }
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        spec->addrlen = sizeof(*in4);
        return 0;
    }
    if (strcmp(family, "tcp") == 0 && inet_pton(AF_INET6, address, &in6->sin6_addr) == 1) {
        if (!IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) {
            PyErr_Format(PyExc_ValueError, "address: %s is not loopback (127.0.0.0/8, ::1)", address);
            return -1;
        }
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        spec->addrlen = sizeof(*in6);
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "address: '%s' is not a numeric loopback address for family '%s'",
                 address, family);
    return -1;
}

static int Load_init_claimed(LoadObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"family", "address", "port", "connections", "size", "connect_timeout",
                             "cpu", "max_errors", "seed", "connect_rate", "pipeline", "source", NULL};
    const char *family, *address;
    PyObject *port_o, *connections_o, *size_o, *cpu_o = NULL, *max_errors_o = NULL, *seed_o = NULL;
    PyObject *pipeline_o = NULL;
    const char *source = NULL;
    long long port, cpu = -1, connections, size, pipeline = 1;
    unsigned long long max_errors = 0, seed = 0;
    double connect_timeout = 30.0, connect_rate = 0.0;
    if (self->load) {
        PyErr_SetString(PyExc_RuntimeError, "Load is already open");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "ssOOO|dOOOdOz", kwlist, &family, &address, &port_o,
                                     &connections_o, &size_o, &connect_timeout, &cpu_o,
                                     &max_errors_o, &seed_o, &connect_rate, &pipeline_o, &source))
        return -1;
    if (int_arg(port_o, "port", 0, 65535, &port) < 0 ||
        int_arg(connections_o, "connections", 1, PCB_LOAD_MAX_CONNECTIONS, &connections) < 0 ||
        int_arg(size_o, "size", 1, PCB_LOAD_MAX_SIZE, &size) < 0 ||
        (cpu_o && int_arg(cpu_o, "cpu", -1, CPU_SETSIZE - 1, &cpu) < 0) ||
        (max_errors_o && uint_arg(max_errors_o, "max_errors", 0, UINT32_MAX, &max_errors) < 0) ||
        (seed_o && uint_arg(seed_o, "seed", 0, UINT64_MAX, &seed) < 0) ||
        (pipeline_o && int_arg(pipeline_o, "pipeline", 1, PCB_LOAD_MAX_PIPELINE, &pipeline) < 0))
        return -1;
    if ((unsigned long long)connections * (unsigned long long)pipeline > PCB_LOAD_MAX_INFLIGHT) {
        PyErr_Format(PyExc_ValueError,
                     "pipeline: %lld messages in flight times %lld connections is more than %u",
                     pipeline, connections, PCB_LOAD_MAX_INFLIGHT);
        return -1;
    }
    if ((unsigned long long)connections * (unsigned long long)size > PCB_LOAD_MAX_PAYLOAD) {
        PyErr_Format(PyExc_ValueError,
                     "size: %lld bytes times %lld connections needs more than %llu GiB of message "
                     "buffers", size, connections, PCB_LOAD_MAX_PAYLOAD >> 30);
        return -1;
    }
    if (!(connect_timeout > 0)) {
        PyErr_SetString(PyExc_ValueError, "connect_timeout: must be > 0");
        return -1;
    }
    if (!(connect_rate == 0 || (connect_rate >= PCB_LOAD_MIN_RATE && connect_rate <= PCB_LOAD_MAX_RATE))) {
        char msg[160];
        PyOS_snprintf(msg, sizeof(msg), "connect_rate: must be 0 (unpaced) or %g .. %g connections "
                      "per second, got %g", PCB_LOAD_MIN_RATE, PCB_LOAD_MAX_RATE, connect_rate);
        PyErr_SetString(PyExc_ValueError, msg);
        return -1;
    }
    memset(&self->spec, 0, sizeof(self->spec));
    if (parse_address(&self->spec, family, address, port) < 0)
        return -1;
    self->spec.connections = (uint32_t)connections;
    self->spec.size = (uint32_t)size;
    self->spec.connect_timeout = connect_timeout;
    self->spec.connect_rate = connect_rate;
    self->spec.cpu = (int)cpu;
    self->spec.max_errors = (uint32_t)max_errors;
    self->spec.seed = seed;
    self->spec.pipeline = (uint32_t)pipeline;
    if (source && *source) {
        /* a local address to bind: loopback and of the server's family, checked by the same rule */
        pcb_load_spec tmp;
        if (strcmp(family, "tcp") != 0) {
            PyErr_SetString(PyExc_ValueError, "source: only for tcp (a UNIX socket has no source address)");
            return -1;
        }
        if (parse_address(&tmp, "tcp", source, 1) < 0)
            return -1;
        if (tmp.addr.ss_family != self->spec.addr.ss_family) {
            PyErr_Format(PyExc_ValueError, "source: %s is not of the server address's family", source);
            return -1;
        }
        if (tmp.addr.ss_family == AF_INET)
            ((struct sockaddr_in *)&tmp.addr)->sin_port = 0;
        else
            ((struct sockaddr_in6 *)&tmp.addr)->sin6_port = 0;
        self->spec.source = tmp.addr;
        self->spec.sourcelen = tmp.addrlen;
    }
    return 0;
}

static void Load_dealloc(LoadObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->load) {
        pcb_load_close(self->load);
        self->load = NULL;
    }
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

PyDoc_STRVAR(Load_open_doc,
"open() -> dict\n\nEstablishes every connection (GIL released). Returns the result dict: status\n"
"'ok' with elapsed = connect seconds, or a failure status and message (the load stays closed).");

static PyObject *Load_open_claimed(LoadObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->load) {
        PyErr_SetString(PyExc_RuntimeError, "Load is already open");
        return NULL;
    }
    pcb_phase_result res;
    gil_ctx g;
    g.save = PyEval_SaveThread();
    pcb_load *load = pcb_load_open(&self->spec, &res, check_signals, &g);
    PyEval_RestoreThread(g.save);
    if (res.status == PCB_FAIL_INTERRUPTED && PyErr_Occurred())
        return NULL;
    if (load) {
        __atomic_store_n(&self->load, load, __ATOMIC_RELEASE); /* is_open reads it unclaimed */
        self->owner = PyThread_get_thread_ident();
    }
    return result_dict(&res);
}

PyDoc_STRVAR(Load_phase_doc,
"phase(messages, duration, stall_timeout, deadline, minimal=False, rate=0.0,\n"
"      arrival='uniform') -> dict\n\n"
"Runs one phase with the GIL released: `messages` round trips (or `duration` seconds when\n"
"messages is 0).  rate 0: a closed loop; rate > 0: an open loop at that many round trips per\n"
"second in all, arrivals 'uniform' or 'poisson', latency from each message's intended send\n"
"time.  Adds 'latency' (the phase's Histogram, ns), 'latency_uncorrected' (open loop: from the\n"
"actual send; None in a closed loop) and 'per_conn' to the result dict.\n"
"Raises the pending exception if a signal handler raised (KeyboardInterrupt, timeouts);\n"
"RuntimeError when another open() or phase() of this load is running (a signal handler, a\n"
"thread).  Seconds beyond about 31 years count as 31 years.");

static PyObject *Load_phase_claimed(LoadObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"messages", "duration", "stall_timeout", "deadline", "minimal", "rate",
                             "arrival", NULL};
    PyObject *messages_o;
    unsigned long long messages;
    double duration, stall_timeout, deadline, rate = 0.0;
    int minimal = 0, arrival_kind = PCB_ARRIVAL_UNIFORM;
    const char *arrival = "uniform";
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Oddd|pds", kwlist, &messages_o, &duration,
                                     &stall_timeout, &deadline, &minimal, &rate, &arrival))
        return NULL;
    if (strcmp(arrival, "poisson") == 0)
        arrival_kind = PCB_ARRIVAL_POISSON;
    else if (strcmp(arrival, "uniform") != 0) {
        PyErr_Format(PyExc_ValueError, "arrival: must be 'uniform' or 'poisson', got '%s'", arrival);
        return NULL;
    }
    if (!(rate == 0 || (rate >= PCB_LOAD_MIN_OPEN_RATE && rate <= PCB_LOAD_MAX_OPEN_RATE))) {
        char msg[160];
        PyOS_snprintf(msg, sizeof(msg), "rate: must be 0 (closed loop) or %g .. %g round trips per "
                      "second, got %g", PCB_LOAD_MIN_OPEN_RATE, PCB_LOAD_MAX_OPEN_RATE, rate);
        PyErr_SetString(PyExc_ValueError, msg);
        return NULL;
    }
    if (rate > 0 && minimal) {
        PyErr_SetString(PyExc_ValueError, "phase: minimal (the ceiling client) is closed-loop only");
        return NULL;
    }
    if (uint_arg(messages_o, "messages", 0, PCB_LOAD_MAX_MESSAGES, &messages) < 0)
        return NULL;
    if (!self->load) {
        PyErr_SetString(PyExc_RuntimeError, "Load is not open");
        return NULL;
    }
    if (self->owner != PyThread_get_thread_ident()) {
        PyErr_SetString(PyExc_RuntimeError, "Load.phase() must run in the thread that opened it");
        return NULL;
    }
    if (messages == 0 && !(duration > 0)) {
        PyErr_SetString(PyExc_ValueError, "phase: give messages > 0 or duration > 0");
        return NULL;
    }
    if (!(stall_timeout > 0) || !(deadline > 0)) {
        PyErr_SetString(PyExc_ValueError, "phase: stall_timeout and deadline must be > 0");
        return NULL;
    }
    pcb_phase_spec ps = {.messages = messages, .duration = duration, .stall_timeout = stall_timeout,
                         .deadline = deadline, .minimal = minimal, .rate = rate,
                         .arrival = arrival_kind};
    pcb_phase_result res;
    gil_ctx g;
    g.save = PyEval_SaveThread();
    pcb_load_phase(self->load, &ps, &res, check_signals, &g);
    PyEval_RestoreThread(g.save);
    if (res.status == PCB_FAIL_INTERRUPTED && PyErr_Occurred())
        return NULL;

    PyObject *d = result_dict(&res);
    if (!d)
        return NULL;
    PyObject *module = PyType_GetModule(Py_TYPE(self));
    HistObject *hist = module ? hist_alloc(get_state(module)->hist_type) : NULL;
    if (hist)
        memcpy(hist->h, pcb_load_hist(self->load), sizeof(pcb_hist));
    PyObject *lat = (PyObject *)hist;
    PyObject *unc = Py_None;
    Py_INCREF(unc);
    if (hist && rate > 0) {
        Py_DECREF(unc);
        HistObject *h2 = hist_alloc(get_state(module)->hist_type);
        if (h2)
            memcpy(h2->h, pcb_load_hist_uncorrected(self->load), sizeof(pcb_hist));
        unc = (PyObject *)h2;
    }
    uint32_t n = pcb_load_connections(self->load);
    const uint64_t *pc = pcb_load_per_conn(self->load);
    PyObject *per = PyList_New(n);
    if (!lat || !per || !unc) {
        Py_XDECREF(lat);
        Py_XDECREF(unc);
        Py_XDECREF(per);
        Py_DECREF(d);
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(pc[i]);
        if (!v) {
            Py_DECREF(lat);
            Py_DECREF(unc);
            Py_DECREF(per);
            Py_DECREF(d);
            return NULL;
        }
        PyList_SET_ITEM(per, i, v);
    }
    int r1 = PyDict_SetItemString(d, "latency", lat);
    int r2 = PyDict_SetItemString(d, "per_conn", per);
    int r3 = PyDict_SetItemString(d, "latency_uncorrected", unc);
    Py_DECREF(lat);
    Py_DECREF(unc);
    Py_DECREF(per);
    if (r1 < 0 || r2 < 0 || r3 < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *Load_close_claimed(LoadObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->load) {
        pcb_load *load = self->load;
        __atomic_store_n(&self->load, NULL, __ATOMIC_RELEASE);
        Py_BEGIN_ALLOW_THREADS
        pcb_load_close(load);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

CLAIMED_METHOD(int, Load_init, (LoadObject *self, PyObject *args, PyObject *kwds), (self, args, kwds), LOAD_INIT, -1)
CLAIMED_METHOD(PyObject *, Load_open, (LoadObject *self, PyObject *Py_UNUSED(ignored)), (self, NULL), LOAD_OPEN, NULL)
CLAIMED_METHOD(PyObject *, Load_phase, (LoadObject *self, PyObject *args, PyObject *kwds), (self, args, kwds), LOAD_PHASE, NULL)
CLAIMED_METHOD(PyObject *, Load_close, (LoadObject *self, PyObject *Py_UNUSED(ignored)), (self, NULL), LOAD_CLOSE, NULL)

static PyObject *Load_get_busy(LoadObject *self, void *Py_UNUSED(closure))
{
    int holder = __atomic_load_n(&self->busy, __ATOMIC_ACQUIRE);
    if (holder == LOAD_IDLE)
        Py_RETURN_NONE;
    return PyUnicode_FromString(LOAD_CALLS[holder]);
}

static PyObject *Load_get_is_open(LoadObject *self, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(__atomic_load_n(&self->load, __ATOMIC_ACQUIRE) != NULL);
}

static PyMethodDef Load_methods[] = {
    {"open", (PyCFunction)Load_open, METH_NOARGS, Load_open_doc},
    {"phase", (PyCFunction)(void (*)(void))Load_phase, METH_VARARGS | METH_KEYWORDS, Load_phase_doc},
    {"close", (PyCFunction)Load_close, METH_NOARGS,
     "close()\n\nCloses every connection; idempotent.  RuntimeError while open() or phase() runs."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Load_getset[] = {
    {"is_open", (getter)Load_get_is_open, NULL, "True between open() and close().", NULL},
    {"busy", (getter)Load_get_busy, NULL,
     "The call that holds the load now ('open', 'phase', ...) or None: what another thread would be "
     "refused for.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Load_slots[] = {
    {Py_tp_doc, "Load(family, address, port, connections, size, connect_timeout=30.0, cpu=-1, "
                "max_errors=0, seed=0, connect_rate=0.0)\n\n"
                "A set of connections to one loopback echo server, driven by the C epoll engine.\n"
                "connections 1 .. MAX_CONNECTIONS, size 1 .. MAX_SIZE, connections x size at most\n"
                "MAX_PAYLOAD_MEMORY, cpu -1 .. 1023, max_errors 0 .. 2**32-1, seed 0 .. 2**64-1,\n"
                "connect_rate 0 (unpaced) or 0.1 .. 1e7 connects a second: ValueError outside,\n"
                "naming the argument."},
    {Py_tp_init, Load_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Load_dealloc},
    {Py_tp_methods, Load_methods},
    {Py_tp_getset, Load_getset},
    {0, NULL},
};

static PyType_Spec Load_spec = {
    .name = "pyconcbench._native.Load",
    .basicsize = sizeof(LoadObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = Load_slots,
};

/* ---- servers and probes ----------------------------------------------------------- */

static PyObject *stats_dict(const pcb_echo_stats *st)
{
    return Py_BuildValue("{s:K,s:K,s:K}", "accepted", (unsigned long long)st->accepted, "bytes",
                         (unsigned long long)st->bytes, "errors", (unsigned long long)st->errors);
}

PyDoc_STRVAR(echo_epoll_doc,
"echo_epoll(listen_fd, stop_fd) -> dict(accepted, bytes, errors)\n\n"
"Serves the listening socket with the one-thread epoll echo server (GIL released) until\n"
"stop_fd is readable.  OSError if setup fails.");

static PyObject *echo_epoll(PyObject *module, PyObject *args)
{
    int listen_fd, stop_fd, r;
    pcb_echo_stats st = {0};
    char err[256] = "";
    if (!PyArg_ParseTuple(args, "ii:echo_epoll", &listen_fd, &stop_fd))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    r = pcb_echo_epoll(listen_fd, stop_fd, &st, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (r != 0)
        return PyErr_Format(PyExc_OSError, "echo_epoll: %s", err);
    return stats_dict(&st);
}

PyDoc_STRVAR(echo_threads_doc,
"echo_threads(listen_fd, stop_fd, stack_size=0) -> dict(accepted, bytes, errors)\n\n"
"Serves the listening socket with one OS thread per connection (GIL released) until\n"
"stop_fd is readable.  stack_size 0 means 64 KiB.");

static PyObject *echo_threads(PyObject *module, PyObject *args)
{
    int listen_fd, stop_fd, r;
    Py_ssize_t stack_size = 0;
    pcb_echo_stats st = {0};
    char err[256] = "";
    if (!PyArg_ParseTuple(args, "ii|n:echo_threads", &listen_fd, &stop_fd, &stack_size))
        return NULL;
    if (stack_size < 0)
        return PyErr_Format(PyExc_ValueError, "stack_size: must be >= 0, got %zd", stack_size);
    Py_BEGIN_ALLOW_THREADS
    r = pcb_echo_threads(listen_fd, stop_fd, (size_t)stack_size, &st, err, sizeof(err));
    Py_END_ALLOW_THREADS
    if (r != 0)
        return PyErr_Format(PyExc_OSError, "echo_threads: %s", err);
    return stats_dict(&st);
}

PyDoc_STRVAR(cacheline_rtt_doc,
"cacheline_rtt(cpu_a, cpu_b, iterations) -> float\n\n"
"Median ns of a cache-line round trip between a thread on cpu_a and one on cpu_b (GIL\n"
"released).  iterations 1 .. CACHELINE_MAX_ITERATIONS (ValueError outside); a signal handler's\n"
"exception (KeyboardInterrupt) stops the probe within about 100 ms.");

static PyObject *cacheline_rtt(PyObject *module, PyObject *args)
{
    PyObject *a_o, *b_o, *iterations_o;
    long long a, b, iterations;
    double ns;
    if (!PyArg_ParseTuple(args, "OOO:cacheline_rtt", &a_o, &b_o, &iterations_o))
        return NULL;
    if (int_arg(a_o, "cpu_a", 0, CPU_SETSIZE - 1, &a) < 0 ||
        int_arg(b_o, "cpu_b", 0, CPU_SETSIZE - 1, &b) < 0 ||
        int_arg(iterations_o, "iterations", 1, PCB_PROBE_MAX_ITERATIONS, &iterations) < 0)
        return NULL;
    gil_ctx g;
    g.save = PyEval_SaveThread();
    ns = pcb_cacheline_rtt((int)a, (int)b, (long)iterations, check_signals, &g);
    int e = errno;
    PyEval_RestoreThread(g.save);
    if (ns < 0) {
        if (e == EINTR && PyErr_Occurred())
            return NULL;
        if (e == EINVAL)
            return PyErr_Format(PyExc_ValueError, "cacheline_rtt: CPU %lld or %lld is not available",
                                a, b);
        errno = e;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyFloat_FromDouble(ns);
}

static PyObject *set_pdeathsig(PyObject *module, PyObject *args)
{
    int sig;
    if (!PyArg_ParseTuple(args, "i:set_pdeathsig", &sig))
        return NULL;
    if (prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* ==== switch microbenchmarks (pcb_micro.c) ===================================== begin ==== */

#include "pcb_micro.h"

PyDoc_STRVAR(micro_run_doc,
"micro_run(case, n, threads=1, cpu_a=-1, cpu_b=-1, timeout=60.0) -> dict\n\n"
"Runs one native switch microbenchmark (see native/pcb_micro.h) with the GIL released: n\n"
"iterations timed inside C, after the same number of empty-loop iterations.  Returns\n"
"{'case', 'n', 'threads', 'ops', 'elapsed_ns', 'empty_ns', 'check', 'waited_ns'}.  ValueError\n"
"for bad arguments, TimeoutError when the run takes longer than timeout seconds, OSError when a\n"
"system call fails; a signal handler's exception (KeyboardInterrupt) stops the run.");

static PyObject *micro_run(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"case", "n", "threads", "cpu_a", "cpu_b", "timeout", NULL};
    const char *name;
    PyObject *n_o, *threads_o = NULL;
    unsigned long long n;
    long long threads = 1;
    int cpu_a = -1, cpu_b = -1;
    double timeout = 60.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "sO|Oiid:micro_run", kwlist, &name, &n_o,
                                     &threads_o, &cpu_a, &cpu_b, &timeout))
        return NULL;
    if (uint_arg(n_o, "n", 1, PCB_MICRO_MAX_N, &n) < 0 ||
        (threads_o && int_arg(threads_o, "threads", 1, PCB_MICRO_MAX_THREADS, &threads) < 0))
        return NULL;
    int index = pcb_micro_find(name);
    if (index < 0)
        return PyErr_Format(PyExc_ValueError, "case: unknown native case '%s'", name);
    pcb_micro_spec spec = {.n = n, .threads = (uint32_t)threads, .cpu_a = cpu_a, .cpu_b = cpu_b,
                           .timeout = timeout};
    pcb_micro_result res;
    char err[256];
    gil_ctx g;
    g.save = PyEval_SaveThread();
    int r = pcb_micro_run(index, &spec, &res, check_signals, &g, err, sizeof(err));
    int e = errno;
    PyEval_RestoreThread(g.save);
    if (r != 0) {
        if (e == EINTR && PyErr_Occurred())
            return NULL;
        if (e == EINVAL)
            return PyErr_Format(PyExc_ValueError, "micro_run(%s): %s", name, err);
        PyObject *exc_args = Py_BuildValue("(is)", e, err);
        if (exc_args) {
            PyErr_SetObject(PyExc_OSError, exc_args); /* OSError picks the subclass: TimeoutError */
            Py_DECREF(exc_args);
        }
        return NULL;
    }
    return Py_BuildValue("{s:s,s:K,s:I,s:K,s:L,s:L,s:K,s:L}", "case", name, "n", n, "threads",
                         (unsigned int)threads, "ops", (unsigned long long)res.ops, "elapsed_ns",
                         (long long)res.elapsed_ns, "empty_ns", (long long)res.empty_ns,
                         "check", (unsigned long long)res.check, "waited_ns",
                         (long long)res.waited_ns);
}

PyDoc_STRVAR(micro_cases_doc,
"micro_cases() -> dict\n\n"
"The native switch microbenchmarks: name -> {'two_party': bool, 'threaded': bool}.");

static PyObject *micro_cases(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    for (int i = 0; pcb_micro_names[i]; i++) {
        PyObject *v = Py_BuildValue("{s:O,s:O}", "two_party",
                                    pcb_micro_two_party(i) ? Py_True : Py_False, "threaded",
                                    pcb_micro_threaded(i) ? Py_True : Py_False);
        if (!v || PyDict_SetItemString(d, pcb_micro_names[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

/* ==== switch microbenchmarks ======================================================== end ==== */

static PyMethodDef module_methods[] = {
    {"echo_epoll", echo_epoll, METH_VARARGS, echo_epoll_doc},
    {"echo_threads", echo_threads, METH_VARARGS, echo_threads_doc},
    {"cacheline_rtt", cacheline_rtt, METH_VARARGS, cacheline_rtt_doc},
    {"set_pdeathsig", set_pdeathsig, METH_VARARGS, "set_pdeathsig(signum)\n\nprctl(PR_SET_PDEATHSIG)."},
    /* switch microbenchmarks */
    {"micro_run", (PyCFunction)(void (*)(void))micro_run, METH_VARARGS | METH_KEYWORDS, micro_run_doc},
    {"micro_cases", micro_cases, METH_NOARGS, micro_cases_doc},
    {NULL, NULL, 0, NULL},
};

/* A float constant of the module; -1 with an exception set on failure. */
static int add_double(PyObject *module, const char *name, double value)
{
    PyObject *v = PyFloat_FromDouble(value);
    if (!v)
        return -1;
    int r = PyModule_AddObjectRef(module, name, v);
    Py_DECREF(v);
    return r;
}

static int module_exec(PyObject *module)
{
    module_state *st = get_state(module);
    st->load_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Load_spec, NULL);
    if (!st->load_type)
        return -1;
    if (PyModule_AddType(module, st->load_type) < 0)
        return -1;
    st->hist_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Hist_spec, NULL);
    if (!st->hist_type)
        return -1;
    if (PyModule_AddType(module, st->hist_type) < 0)
        return -1;
    if (PyModule_AddIntConstant(module, "HIST_MIN_NS", PCB_HIST_MIN_NS) < 0 ||
        PyModule_AddIntConstant(module, "HIST_MAX_NS", PCB_HIST_MAX_NS) < 0 ||
        PyModule_AddIntConstant(module, "HIST_SUB_BITS", PCB_HIST_SUB_BITS) < 0 ||
        PyModule_AddIntConstant(module, "MAX_SIZE", PCB_LOAD_MAX_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "MAX_CONNECTIONS", PCB_LOAD_MAX_CONNECTIONS) < 0 ||
        PyModule_AddIntConstant(module, "MAX_PAYLOAD_MEMORY", (long)PCB_LOAD_MAX_PAYLOAD) < 0 ||
        PyModule_AddIntConstant(module, "MAX_MESSAGES", (long)PCB_LOAD_MAX_MESSAGES) < 0 ||
        PyModule_AddIntConstant(module, "MAX_ERRORS", (long)UINT32_MAX) < 0 ||
        PyModule_AddIntConstant(module, "CACHELINE_MAX_ITERATIONS", PCB_PROBE_MAX_ITERATIONS) < 0 ||
        add_double(module, "MIN_CONNECT_RATE", PCB_LOAD_MIN_RATE) < 0 ||
        add_double(module, "MAX_CONNECT_RATE", PCB_LOAD_MAX_RATE) < 0 ||
        PyModule_AddIntConstant(module, "MAX_PIPELINE", PCB_LOAD_MAX_PIPELINE) < 0 ||
        PyModule_AddIntConstant(module, "MAX_INFLIGHT", PCB_LOAD_MAX_INFLIGHT) < 0 ||
        add_double(module, "MIN_OPEN_RATE", PCB_LOAD_MIN_OPEN_RATE) < 0 ||
        add_double(module, "MAX_OPEN_RATE", PCB_LOAD_MAX_OPEN_RATE) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    Py_VISIT(get_state(module)->load_type);
    Py_VISIT(get_state(module)->hist_type);
    return 0;
}

static int module_clear(PyObject *module)
{
    Py_CLEAR(get_state(module)->load_type);
    Py_CLEAR(get_state(module)->hist_type);
    return 0;
}

static void module_free(void *module)
{
    module_clear((PyObject *)module);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#ifdef Py_mod_gil
    /* safe without the GIL: see the note at the top (critical sections, load_claim) */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pyconcbench._native",
    .m_doc = "The C side of pyconcbench: epoll load engine, native echo servers, probes.",
    .m_size = sizeof(module_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModuleDef_Init(&native_module);
}
