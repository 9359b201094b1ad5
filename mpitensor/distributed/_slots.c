/* The agreement slots of a one-machine group, compiled (mpitensor.distributed._fingerprint).
 *
 * The always-on check of a large collective writes this rank's fingerprint of the call into
 * its slot of a segment the group's members share, and reads the others' once its data is
 * done. Written in Python, the write and the read cost about 0.7 us a call: 9 % of a 64 KiB
 * broadcast, against a target of 3 %. Here they are one call each, with the fingerprint read
 * straight from the NumPy array (dtype, shape, byte count) instead of a cache keyed by a tuple.
 *
 * The layout and the protocol are _fingerprint.NodeCheck's, word for word, so that a rank
 * running the Python methods and one running these agree: each member owns a header word (the
 * number of the last call it posted) and RING slots of LINE int64 words, the first four of a
 * slot being the call number, the packed operation word, the byte count and the shape's hash.
 * A writer marks the slot -1, writes the words, then the call number, then its header; the
 * stores are release stores and the loads acquire loads, so a reader that sees the call number
 * sees that call's words.
 *
 * ``settle`` only answers the plain cases (every member agreed; one has not posted yet). Any
 * other reading (a slot that differs, a member whose header is past the call) is handed to the
 * Python method ``_settle_py``, which reads again and words the error.
 */
#define PY_SSIZE_T_CLEAN
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <numpy/arrayobject.h>

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

typedef struct {
    PyObject_HEAD
    Py_buffer view;     /* of the shared segment; view.obj is NULL once released */
    int64_t *q;
    Py_ssize_t me;      /* this rank's header word */
    Py_ssize_t mine;    /* its first slot */
    Py_ssize_t line;    /* words per slot */
    int64_t mask;       /* RING - 1 */
    Py_ssize_t npeers;
    Py_ssize_t *peers;  /* (header word, first slot) of every other member */
    PyObject *ops;      /* operation name -> code */
    PyObject *reduces;  /* ReduceOp -> code */
} Slots;

/* The token of a posted call: (call number, operation word, byte count, shape hash, op, keep)
 * as a sequence, for the Python code that reads it like the Python slots' tuple; one object
 * where a tuple of fresh ints would be four. */
typedef struct {
    PyObject_HEAD
    int64_t w[4];
    PyObject *op;
    PyObject *keep;
} Token;

static void Token_dealloc(Token *self)
{
    Py_XDECREF(self->op);
    Py_XDECREF(self->keep);
    PyObject_Free(self);
}

static Py_ssize_t Token_len(PyObject *self)
{
    (void)self;
    return 6;
}

static PyObject *Token_item(Token *self, Py_ssize_t i)
{
    if (i >= 0 && i < 4)
        return PyLong_FromLongLong(self->w[i]);
    if (i == 4 || i == 5) {
        PyObject *v = i == 4 ? self->op : self->keep;
        Py_INCREF(v);
        return v;
    }
    PyErr_SetString(PyExc_IndexError, "token index out of range");
    return NULL;
}

static PySequenceMethods Token_seq = {
    .sq_length = Token_len,
    .sq_item = (ssizeargfunc)Token_item,
};

static PyTypeObject TokenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpitensor.distributed._slots.Token",
    .tp_basicsize = sizeof(Token),
    .tp_dealloc = (destructor)Token_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A posted call: (call number, operation word, byte count, shape hash, op, keep).",
    .tp_as_sequence = &Token_seq,
};

/* The shape's hash, as _fingerprint._shape_hash computes it (64-bit FNV-style steps). */
static int64_t shape_hash(int nd, const npy_intp *dims)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)nd;
    for (int i = 0; i < nd; i++)
        h = (h ^ (uint64_t)dims[i]) * 0x100000001B3ull;
    return (int64_t)(h & 0x3FFFFFFFFFFFFFFFull);
}

/* The dtype's 16 bits, as _fingerprint._dtype16 computes them: kind, big-endian, item size. */
static int64_t dtype16(PyArray_Descr *d)
{
    int64_t big = d->byteorder == '>';
    return ((int64_t)(unsigned char)d->kind & 0x7F) | big << 7
           | ((int64_t)PyDataType_ELSIZE(d) & 0xFF) << 8;
}

static int code_of(PyObject *table, PyObject *key, int64_t *out)
{
    PyObject *v = PyDict_GetItemWithError(table, key);
    if (v == NULL) {
        if (PyErr_Occurred())
            return -1;
        *out = 0;
        return 0;
    }
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static int Slots_init(Slots *self, PyObject *args, PyObject *kw)
{
    if (kw != NULL && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Slots: positional arguments only");
        return -1;
    }
    PyObject *buf, *ops, *reduces;
    Py_ssize_t rank, size, ring, line;
    if (!PyArg_ParseTuple(args, "OnnnnO!O!", &buf, &rank, &size, &ring, &line, &PyDict_Type,
                          &ops, &PyDict_Type, &reduces))
        return -1;
    if (self->view.obj != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Slots: already initialised");
        return -1;
    }
    if (size < 1 || rank < 0 || rank >= size || ring < 1 || (ring & (ring - 1)) || line < 4) {
        PyErr_SetString(PyExc_ValueError, "Slots: bad rank, size, ring or line");
        return -1;
    }
    if (PyObject_GetBuffer(buf, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    Py_ssize_t region = (ring + 1) * line;
    if (self->view.len < (Py_ssize_t)sizeof(int64_t) * region * size
            || ((uintptr_t)self->view.buf & 7)) {
        PyBuffer_Release(&self->view);
        self->view.obj = NULL;
        PyErr_SetString(PyExc_ValueError, "Slots: the segment is too small or misaligned");
        return -1;
    }
    self->peers = PyMem_Calloc((size_t)(2 * size), sizeof(Py_ssize_t));
    if (self->peers == NULL) {
        PyBuffer_Release(&self->view);
        self->view.obj = NULL;
        PyErr_NoMemory();
        return -1;
    }
    self->q = self->view.buf;
    self->me = rank * region;
    self->mine = self->me + line;
    self->line = line;
    self->mask = ring - 1;
    self->npeers = 0;
    for (Py_ssize_t r = 0; r < size; r++) {
        if (r == rank)
            continue;
        self->peers[2 * self->npeers] = r * region;
        self->peers[2 * self->npeers + 1] = r * region + line;
        self->npeers++;
    }
    Py_INCREF(ops);
    Py_INCREF(reduces);
    self->ops = ops;
    self->reduces = reduces;
    return 0;
}

static void Slots_dealloc(Slots *self)
{
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    PyMem_Free(self->peers);
    Py_XDECREF(self->ops);
    Py_XDECREF(self->reduces);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int usable(Slots *self)
{
    if (self->view.obj == NULL) {
        PyErr_SetString(PyExc_ValueError, "the group's agreement slots are released");
        return 0;
    }
    return 1;
}

/* post(s, op, arr, reduce, root, keep): write this rank's fingerprint of call s and return the
 * token to settle it with (a Token). */
static PyObject *Slots_post(Slots *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "post(s, op, arr, reduce, root, keep)");
        return NULL;
    }
    if (!usable(self))
        return NULL;
    PyObject *arr = args[2];
    int64_t a, nbytes, h;
    if (PyArray_CheckExact(arr)) {
        PyArrayObject *x = (PyArrayObject *)arr;
        nbytes = (int64_t)PyArray_NBYTES(x);
        int64_t op, red = 0;
        if (code_of(self->ops, args[1], &op) < 0)
            return NULL;
        if (args[3] != Py_None && code_of(self->reduces, args[3], &red) < 0)
            return NULL;
        int64_t root = PyLong_AsLongLong(args[4]);
        if (root == -1 && PyErr_Occurred())
            return NULL;
        a = op | red << 5 | dtype16(PyArray_DESCR(x)) << 10 | (root + 1) << 26;
        h = shape_hash(PyArray_NDIM(x), PyArray_DIMS(x));
    } else {
        /* another array type (CuPy): the Python method computes the words */
        PyObject *w = PyObject_CallMethod((PyObject *)self, "_words_of", "OOOO", args[1], arr,
                                          args[3], args[4]);
        if (w == NULL)
            return NULL;
        int ok = PyArg_ParseTuple(w, "LLL", &a, &nbytes, &h);
        Py_DECREF(w);
        if (!ok)
            return NULL;
    }
    int64_t s = PyLong_AsLongLong(args[0]);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    int64_t *q = self->q;
    Py_ssize_t i = self->mine + (Py_ssize_t)((s & self->mask) * self->line);
    STORE(&q[i], -1);
    STORE(&q[i + 1], a);
    STORE(&q[i + 2], nbytes);
    STORE(&q[i + 3], h);
    STORE(&q[i], s);
    STORE(&q[self->me], s);
    Token *tok = PyObject_New(Token, &TokenType);
    if (tok == NULL)
        return NULL;
    tok->w[0] = s;
    tok->w[1] = a;
    tok->w[2] = nbytes;
    tok->w[3] = h;
    Py_INCREF(args[1]);
    Py_INCREF(args[5]);
    tok->op = args[1];
    tok->keep = args[5];
    return (PyObject *)tok;
}

/* settle(tok, g, look=False): see _fingerprint.NodeCheck.settle. True: every other member
 * posted the same words for the call; False: one has not posted yet; anything else is read
 * again, and worded, by the Python method. */
static PyObject *Slots_settle(Slots *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 && nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "settle(tok, g[, look])");
        return NULL;
    }
    if (!usable(self))
        return NULL;
    PyObject *tok = args[0];
    int look = 0;
    if (nargs == 3 && (look = PyObject_IsTrue(args[2])) < 0)
        return NULL;
    int64_t w[4];
    if (Py_IS_TYPE(tok, &TokenType)) {
        memcpy(w, ((Token *)tok)->w, sizeof w);
    } else if (PyTuple_Check(tok) && PyTuple_GET_SIZE(tok) >= 4) {
        for (int k = 0; k < 4; k++) {
            w[k] = PyLong_AsLongLong(PyTuple_GET_ITEM(tok, k));
            if (w[k] == -1 && PyErr_Occurred())
                return NULL;
        }
    } else {
        PyErr_SetString(PyExc_TypeError, "settle: not a token of post()");
        return NULL;
    }
    const int64_t s = w[0];
    const int64_t *q = self->q;
    Py_ssize_t off = (Py_ssize_t)((s & self->mask) * self->line);
    int posted = 1;
    for (Py_ssize_t p = 0; p < self->npeers; p++) {
        const int64_t *slot = q + self->peers[2 * p + 1] + off;
        int64_t t = LOAD(&slot[0]);
        if (t == s) {
            if (LOAD(&slot[1]) == w[1] && LOAD(&slot[2]) == w[2] && LOAD(&slot[3]) == w[3])
                continue;
            goto closer;
        }
        if (t > s)
            continue;  /* it compared call s already, and went on */
        if (t != -1 && LOAD(&q[self->peers[2 * p]]) > s)
            goto closer;  /* past call s: did it post it? */
        if (!look)
            Py_RETURN_FALSE;
        posted = 0;
    }
    return PyBool_FromLong(posted);
closer:
    return PyObject_CallMethod((PyObject *)self, "_settle_py", "OOO", tok, args[1],
                               look ? Py_True : Py_False);
}

static PyObject *Slots_release(Slots *self, PyObject *Py_UNUSED(unused))
{
    if (self->view.obj != NULL) {
        PyBuffer_Release(&self->view);
        self->view.obj = NULL;
        self->q = NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef Slots_methods[] = {
    {"post", (PyCFunction)(void (*)(void))Slots_post, METH_FASTCALL,
     "post(s, op, arr, reduce, root, keep): write call s's fingerprint."},
    {"settle", (PyCFunction)(void (*)(void))Slots_settle, METH_FASTCALL,
     "settle(tok, g[, look]): compare the other members' fingerprints of the call."},
    {"release", (PyCFunction)Slots_release, METH_NOARGS, "Let go of the segment."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SlotsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpitensor.distributed._slots.Slots",
    .tp_basicsize = sizeof(Slots),
    .tp_dealloc = (destructor)Slots_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A group's shared agreement slots (see _fingerprint.NodeCheck).",
    .tp_methods = Slots_methods,
    .tp_init = (initproc)Slots_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_slots",
    .m_doc = "Compiled agreement slots (see _fingerprint).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__slots(void)
{
    import_array();
    if (PyType_Ready(&SlotsType) < 0 || PyType_Ready(&TokenType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&SlotsType);
    if (PyModule_AddObject(m, "Slots", (PyObject *)&SlotsType) < 0) {
        Py_DECREF(&SlotsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
