/* The agreement slots of a one-machine group, compiled (mpitensor.distributed.health.fingerprint).
 *
 * The always-on check of a large collective writes this rank's fingerprint of the call into
 * its slot of a segment the group's members share, and reads the others' once its data is
 * done. Written in Python, the write and the read cost about 0.7 us a call: 9 % of a 64 KiB
 * broadcast, against a target of 3 % (compiled: 0.1-0.3 us). Most of what is left is cache
 * lines moving between cores: ``post`` starts fetching the other members' slots for the call
 * (they are usually written by the time this rank's data is done) and a ``settle`` that agreed
 * takes this rank's next slot back from its readers, both off the path the caller waits on. Here they are one call each, with the fingerprint read
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
 * ``post_splits`` writes an uneven all-to-all's counts into this rank's row of the split sizes
 * board (after the slots: RING rows of ``size`` words per member), then its slot; ``settle`` of
 * its token compares each member's count for this rank with the one expected.
 *
 * ``settle`` only answers the plain cases of its own tokens (every member agreed; one has not
 * posted yet). Any other reading (a slot or a count that differs, a member whose header is past
 * the call) and any other token (the Python slots' tuples) is handed to the Python method
 * ``_settle_py``, which reads again and words the error.
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
    Py_ssize_t rank, size;
    Py_ssize_t board;   /* the split sizes board's first word, or -1: none */
    Py_ssize_t npeers;
    Py_ssize_t *peers;  /* (header word, first slot, rank) of every other member */
    PyObject *ops;      /* operation name -> code */
    PyObject *reduces;  /* ReduceOp -> code */
    int64_t uneven[2];  /* the codes of all_to_all and of all_to_all_single with split sizes */
} Slots;

/* The token of a posted call: (call number, operation word, byte count, shape hash, op, keep)
 * as a sequence, for the Python code that reads it like the Python slots' tuple; one object
 * where a tuple of fresh ints would be four. A call of post_splits has a seventh item: (send
 * counts, expected counts, what names them, elements per row). */
typedef struct {
    PyObject_HEAD
    int64_t w[4];
    PyObject *op;
    PyObject *keep;
    PyObject *splits;  /* NULL for a call of post */
} Token;

static void Token_dealloc(Token *self)
{
    Py_XDECREF(self->op);
    Py_XDECREF(self->keep);
    Py_XDECREF(self->splits);
    PyObject_Free(self);
}

static Py_ssize_t Token_len(Token *self)
{
    return self->splits == NULL ? 6 : 7;
}

static PyObject *Token_item(Token *self, Py_ssize_t i)
{
    if (i >= 0 && i < 4)
        return PyLong_FromLongLong(self->w[i]);
    PyObject *v = i == 4 ? self->op : i == 5 ? self->keep : i == 6 ? self->splits : NULL;
    if (v == NULL) {
        PyErr_SetString(PyExc_IndexError, "token index out of range");
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

static Token *new_token(int64_t s, int64_t a, int64_t nbytes, int64_t h, PyObject *op,
                        PyObject *keep, PyObject *splits);

static PySequenceMethods Token_seq = {
    .sq_length = (lenfunc)Token_len,
    .sq_item = (ssizeargfunc)Token_item,
};

static PyTypeObject TokenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpitensor.distributed.health._slots.Token",
    .tp_basicsize = sizeof(Token),
    .tp_dealloc = (destructor)Token_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A posted call: (call number, operation word, byte count, shape hash, op, keep).",
    .tp_as_sequence = &Token_seq,
};

static Token *new_token(int64_t s, int64_t a, int64_t nbytes, int64_t h, PyObject *op,
                        PyObject *keep, PyObject *splits)
{
    Token *tok = PyObject_New(Token, &TokenType);
    if (tok == NULL)
        return NULL;
    tok->w[0] = s;
    tok->w[1] = a;
    tok->w[2] = nbytes;
    tok->w[3] = h;
    Py_INCREF(op);
    Py_INCREF(keep);
    Py_XINCREF(splits);
    tok->op = op;
    tok->keep = keep;
    tok->splits = splits;
    return tok;
}

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
    Py_ssize_t rank, size, ring, line, board;
    if (!PyArg_ParseTuple(args, "OnnnnnO!O!", &buf, &rank, &size, &ring, &line, &board,
                          &PyDict_Type, &ops, &PyDict_Type, &reduces))
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
    Py_ssize_t words = board < 0 ? region * size : board + ring * size * size;
    if ((board >= 0 && board < region * size)
            || self->view.len < (Py_ssize_t)sizeof(int64_t) * words
            || ((uintptr_t)self->view.buf & 7)) {
        PyBuffer_Release(&self->view);
        self->view.obj = NULL;
        PyErr_SetString(PyExc_ValueError, "Slots: the segment is too small or misaligned");
        return -1;
    }
    self->peers = PyMem_Calloc((size_t)(3 * size), sizeof(Py_ssize_t));
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
    self->rank = rank;
    self->size = size;
    self->board = board;
    self->npeers = 0;
    for (Py_ssize_t r = 0; r < size; r++) {
        if (r == rank)
            continue;
        self->peers[3 * self->npeers] = r * region;
        self->peers[3 * self->npeers + 1] = r * region + line;
        self->peers[3 * self->npeers + 2] = r;
        self->npeers++;
    }
    static const char *const uneven[2] = {"all_to_all", "all_to_all_single with split sizes"};
    for (int k = 0; k < 2; k++) {
        PyObject *v = PyDict_GetItemString(ops, uneven[k]);  /* (borrowed; absent: 0) */
        self->uneven[k] = v == NULL ? 0 : PyLong_AsLongLong(v);
        if (self->uneven[k] == -1 && PyErr_Occurred()) {
            PyBuffer_Release(&self->view);
            self->view.obj = NULL;
            return -1;
        }
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

/* Fill this rank's slot for call s: marked, the words, the call number, then the header (the
 * order readers rely on); then start fetching the other members' slots for the call (a member
 * that posted already has its line on the way while this rank waits for its data). */
static void write_slot(Slots *self, int64_t s, int64_t a, int64_t nbytes, int64_t h)
{
    int64_t *q = self->q;
    Py_ssize_t off = (Py_ssize_t)((s & self->mask) * self->line);
    Py_ssize_t i = self->mine + off;
    STORE(&q[i], -1);
    STORE(&q[i + 1], a);
    STORE(&q[i + 2], nbytes);
    STORE(&q[i + 3], h);
    STORE(&q[i], s);
    STORE(&q[self->me], s);
    for (Py_ssize_t p = 0; p < self->npeers; p++)
        __builtin_prefetch(q + self->peers[3 * p + 1] + off, 0, 3);
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
    write_slot(self, s, a, nbytes, h);
    return (PyObject *)new_token(s, a, nbytes, h, args[1], args[5], NULL);
}

/* A count of a list or tuple of n ints (checked by post_splits), or -1 with an error set. */
static int64_t count_at(PyObject *seq, Py_ssize_t i)
{
    return PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
}

static int counts_ok(PyObject *seq, Py_ssize_t n)
{
    return (PyList_CheckExact(seq) || PyTuple_CheckExact(seq))
           && PySequence_Fast_GET_SIZE(seq) == n;
}

/* post_splits(s, op, send, expect, what, unit, dtype, keep): see _fingerprint._Common. */
static PyObject *Slots_post_splits(Slots *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "post_splits(s, op, send, expect, what, unit, dtype, keep)");
        return NULL;
    }
    if (!usable(self))
        return NULL;
    if (self->board < 0) {
        PyErr_SetString(PyExc_ValueError, "this group has no split sizes board");
        return NULL;
    }
    const Py_ssize_t n = self->size;
    if (!counts_ok(args[2], n) || !counts_ok(args[3], n)) {
        PyErr_Format(PyExc_ValueError, "post_splits: send and expect must be lists of %zd ints",
                     n);
        return NULL;
    }
    PyArray_Descr *descr = NULL;  /* (a dtype or anything numpy.dtype() takes) */
    if (!PyArray_DescrConverter(args[6], &descr))
        return NULL;
    const int64_t dt = dtype16(descr);
    Py_DECREF(descr);
    int64_t s = PyLong_AsLongLong(args[0]);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    int single = !PyUnicode_Check(args[1])
                 || PyUnicode_CompareWithASCIIString(args[1], "all_to_all") != 0;
    const int64_t op = self->uneven[single];
    int64_t row[n > 0 ? n : 1];
    for (Py_ssize_t j = 0; j < n; j++) {
        row[j] = count_at(args[2], j);
        if (row[j] == -1 && PyErr_Occurred())
            return NULL;
    }
    PyObject *splits = PyTuple_Pack(4, args[2], args[3], args[4], args[5]);
    if (splits == NULL)
        return NULL;
    const int64_t a = op | dt << 10;
    const int64_t c = s & self->mask;
    int64_t *q = self->q;
    int64_t *mine = q + self->board + (self->rank * (self->mask + 1) + c) * n;
    for (Py_ssize_t j = 0; j < n; j++)
        STORE(&mine[j], row[j]);
    write_slot(self, s, a, 0, 0);
    for (Py_ssize_t p = 0; p < self->npeers; p++) {  /* and their counts for this rank */
        Py_ssize_t r = self->peers[3 * p + 2];
        __builtin_prefetch(q + self->board + (r * (self->mask + 1) + c) * n + self->rank, 0, 3);
    }
    PyObject *tok = (PyObject *)new_token(s, a, 0, 0, args[1], args[7], splits);
    Py_DECREF(splits);
    return tok;
}

/* settle of a post_splits token: 1 every member's count for this rank is the one expected,
 * 0 one has not posted yet, -1 to be read again (and worded) in Python, -2 an error. */
static int settle_splits(Slots *self, Token *tok, int look)
{
    PyObject *send = PyTuple_GET_ITEM(tok->splits, 0);
    PyObject *expect = PyTuple_GET_ITEM(tok->splits, 1);
    const Py_ssize_t n = self->size;
    if (!counts_ok(send, n) || !counts_ok(expect, n))
        return -1;
    const int64_t s = tok->w[0], a = tok->w[1];
    const int64_t c = s & self->mask;
    const int64_t *q = self->q;
    Py_ssize_t off = (Py_ssize_t)(c * self->line);
    int64_t mine = count_at(send, self->rank), want = count_at(expect, self->rank);
    if ((mine == -1 || want == -1) && PyErr_Occurred())
        return -2;
    if (mine != want)
        return -1;
    int posted = 1;
    for (Py_ssize_t p = 0; p < self->npeers; p++) {
        const int64_t *slot = q + self->peers[3 * p + 1] + off;
        int64_t t = LOAD(&slot[0]);
        if (t == s) {
            if (LOAD(&slot[1]) != a || LOAD(&slot[2]) != 0 || LOAD(&slot[3]) != 0)
                return -1;
            Py_ssize_t r = self->peers[3 * p + 2];
            int64_t got = LOAD(&q[self->board + (r * (self->mask + 1) + c) * n + self->rank]);
            if (LOAD(&slot[0]) != s)
                continue;  /* rewritten meanwhile: it went on */
            want = count_at(expect, r);
            if (want == -1 && PyErr_Occurred())
                return -2;
            if (got != want)
                return -1;
            continue;
        }
        if (t > s)
            continue;  /* it went on: more than RING calls ahead, its word is taken for it */
        if (t != -1 && LOAD(&q[self->peers[3 * p]]) > s)
            return -1;  /* past call s: did it post it? */
        if (!look)
            return 0;
        posted = 0;
    }
    return posted;
}

/* settle(tok, g, look=False): see _fingerprint.NodeCheck.settle. True: every other member
 * posted the same words for the call (and, for post_splits' tokens, the counts
 * expected); False: one has not posted yet; anything else is read
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
    if (!Py_IS_TYPE(tok, &TokenType))  /* another token (post_splits', the Python slots') */
        return PyObject_CallMethod((PyObject *)self, "_settle_py", "OOO", tok, args[1],
                                   look ? Py_True : Py_False);
    if (((Token *)tok)->splits != NULL) {
        int r = settle_splits(self, (Token *)tok, look);
        if (r == -2)
            return NULL;
        if (r >= 0)
            return PyBool_FromLong(r);
        return PyObject_CallMethod((PyObject *)self, "_settle_py", "OOO", tok, args[1],
                                   look ? Py_True : Py_False);
    }
    int64_t w[4];
    memcpy(w, ((Token *)tok)->w, sizeof w);
    const int64_t s = w[0];
    const int64_t *q = self->q;
    Py_ssize_t off = (Py_ssize_t)((s & self->mask) * self->line);
    int posted = 1;
    for (Py_ssize_t p = 0; p < self->npeers; p++) {
        const int64_t *slot = q + self->peers[3 * p + 1] + off;
        int64_t t = LOAD(&slot[0]);
        if (t == s) {
            if (LOAD(&slot[1]) == w[1] && LOAD(&slot[2]) == w[2] && LOAD(&slot[3]) == w[3])
                continue;
            goto closer;
        }
        if (t > s)
            continue;  /* it compared call s already, and went on */
        if (t != -1 && LOAD(&q[self->peers[3 * p]]) > s)
            goto closer;  /* past call s: did it post it? */
        if (!look)
            Py_RETURN_FALSE;
        posted = 0;
    }
    if (posted)  /* this rank's slot for the next call: taken back from the readers now */
        __builtin_prefetch(&q[self->mine + (Py_ssize_t)(((s + 1) & self->mask) * self->line)],
                           1, 3);
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
    {"post_splits", (PyCFunction)(void (*)(void))Slots_post_splits, METH_FASTCALL,
     "post_splits(s, op, send, expect, what, unit, dtype, keep): write an all-to-all's counts."},
    {"release", (PyCFunction)Slots_release, METH_NOARGS, "Let go of the segment."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SlotsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpitensor.distributed.health._slots.Slots",
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
