/* Small collectives through a board the members of a one-machine group share (shm_tiny.py).
 *
 * MPICH's blocking Allgather, Bcast and Reduce_scatter_block of a few bytes take 1.4-3 us on
 * two ranks, and a call of ours through a persistent request costs about 1 us more (Python).
 * Here a call is a few stores into this member's entry and a few loads of the others': about
 * 0.3 us for both ranks of a pair once they are both there.
 *
 * The board: one block per member, ``stride`` bytes apart. A block starts with a header of two
 * cache lines (word 0: the number of the last call this member posted; word 8: the number of
 * the last call it finished reading, word 9: its process id), then ``slots`` entries of one
 * cache line of words (call number, operation word, byte count) and ``cap`` bytes of data.
 * Call s uses entry ``s % slots`` of every member.
 *
 * post: a member may overwrite its entry only once every member, itself included, has finished
 * reading what it held (their "done" word is at least the call number the entry holds: a
 * member with async calls still to read must not overwrite one of them); it writes the words
 * and the data, then the call number, then its header, each a release store.
 *
 * take: once every member's entry holds call s with the same operation word and byte count,
 * the result is computed from the entries in rank order (so every member gets the same bits)
 * and "done" goes to s. A member whose entry holds another call while its header is past s made
 * call s another way (a mismatch), as does one whose words differ: take answers -1 - rank
 * before any data is read, whichever members have not posted yet. take spins at most ``spins``
 * times, then yields the core at most ``yields`` times (the board's), then answers 0 (not
 * yet): the caller's bounded wait (timeouts, peers that die) calls it again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stddef.h>
#include <structmember.h>
#include <emmintrin.h>
#include <time.h>
#include <sched.h>
#include <errno.h>
#include <sys/uio.h>

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

#define HEAD 128      /* a member's header: posted (word 0), done (word 8), pid (word 9) */
#define ENTRY_HEAD 64 /* an entry's words: call number, operation word, byte count */
#define NT_MIN 2048   /* a board's nt_min to begin with (copy_in) */
#define NT_BCAST 4096 /* a board's nt_bcast to begin with */

/* ROOTED: a reduce to one member (the root), which alone passes take an output; the others
 * post their data and compare every member's words, as the root does, and read nothing */
enum { GATHER = 0, BCAST = 1, REDUCE = 2, REDUCE_PART = 3, ROOTED = 4 };
enum { SUM = 0, PROD = 1, MIN = 2, MAX = 3, BAND = 4, BOR = 5, BXOR = 6 };
enum { F32 = 0, F64 = 1, I8 = 2, I16 = 3, I32 = 4, I64 = 5, U8 = 6, U16 = 7, U32 = 8, U64 = 9 };

typedef struct {
    PyObject_HEAD
    Py_buffer view;   /* of the shared segment; view.obj is NULL once released */
    char *base;
    Py_ssize_t rank, size, slots, cap, stride;
    Py_ssize_t pending;  /* calls posted and not yet read, kept by shm_tiny.py: run refuses */
    long spins;          /* spins of run's take */
    long yields;         /* then yields of the core, of any take, before it answers 0 */
    Py_ssize_t nt_min;   /* posts of at least this many bytes write their data past the cache */
    Py_ssize_t nt_bcast; /* ... and a broadcast's root's posts of at least this many */
} Board;

static inline int64_t *header(Board *b, Py_ssize_t r) { return (int64_t *)(b->base + r * b->stride); }

static inline int64_t *entry(Board *b, Py_ssize_t r, int64_t s)
{
    return (int64_t *)(b->base + r * b->stride + HEAD + (s % b->slots) * (ENTRY_HEAD + b->cap));
}

static inline char *data(int64_t *e) { return (char *)e + ENTRY_HEAD; }

/* ---------------------------------------------------------------- reductions, rank order */
/* integers wrap (their arithmetic is done unsigned), as MPI's do */
#define INT_LOOP(T, U, OP)                                                     \
    do {                                                                       \
        T *a = (T *)acc; const T *x = (const T *)in;                           \
        for (Py_ssize_t k = 0; k < n; k++) { OP; }                             \
    } while (0)

#define INT_OPS(T, U)                                                                          \
    switch (op) {                                                                              \
    case SUM: INT_LOOP(T, U, a[k] = (T)((U)a[k] + (U)x[k])); return 0;                         \
    case PROD: INT_LOOP(T, U, a[k] = (T)((U)a[k] * (U)x[k])); return 0;                        \
    case MIN: INT_LOOP(T, U, a[k] = x[k] < a[k] ? x[k] : a[k]); return 0;                      \
    case MAX: INT_LOOP(T, U, a[k] = x[k] > a[k] ? x[k] : a[k]); return 0;                      \
    case BAND: INT_LOOP(T, U, a[k] = (T)(a[k] & x[k])); return 0;                              \
    case BOR: INT_LOOP(T, U, a[k] = (T)(a[k] | x[k])); return 0;                               \
    case BXOR: INT_LOOP(T, U, a[k] = (T)(a[k] ^ x[k])); return 0;                              \
    }                                                                                          \
    return -1

/* floats: NaN wins MIN and MAX, as NumPy's minimum and maximum */
#define FLOAT_OPS(T)                                                                           \
    switch (op) {                                                                              \
    case SUM: INT_LOOP(T, T, a[k] = a[k] + x[k]); return 0;                                    \
    case PROD: INT_LOOP(T, T, a[k] = a[k] * x[k]); return 0;                                   \
    case MIN: INT_LOOP(T, T, a[k] = (isnan(a[k]) || a[k] <= x[k]) ? a[k] : x[k]); return 0;    \
    case MAX: INT_LOOP(T, T, a[k] = (isnan(a[k]) || a[k] >= x[k]) ? a[k] : x[k]); return 0;    \
    }                                                                                          \
    return -1

static int combine(char *acc, const char *in, Py_ssize_t nbytes, int dt, int op)
{
    Py_ssize_t n;
    switch (dt) {
    case F32: n = nbytes / 4; FLOAT_OPS(float);
    case F64: n = nbytes / 8; FLOAT_OPS(double);
    case I8: n = nbytes; INT_OPS(int8_t, uint8_t);
    case I16: n = nbytes / 2; INT_OPS(int16_t, uint16_t);
    case I32: n = nbytes / 4; INT_OPS(int32_t, uint32_t);
    case I64: n = nbytes / 8; INT_OPS(int64_t, uint64_t);
    case U8: n = nbytes; INT_OPS(uint8_t, uint8_t);
    case U16: n = nbytes / 2; INT_OPS(uint16_t, uint16_t);
    case U32: n = nbytes / 4; INT_OPS(uint32_t, uint32_t);
    case U64: n = nbytes / 8; INT_OPS(uint64_t, uint64_t);
    }
    return -1;
}

/* ---------------------------------------------------------------- a post's copy */
/* The readers of an entry run on other cores. A plain copy leaves its lines modified in this
 * core's cache: the next post into the entry must first take them back from the readers'
 * caches, and each reader fetches them one by one from this one's. Past a few cache lines that
 * costs more than the copy: 4 KiB took 1.9 us a call between two cores of an EPYC where a copy
 * with non-temporal stores (the lines go to memory, not into this core's cache; the readers'
 * loads stream them) took 0.7 us; at 1 KiB the two were even, at 256 bytes the plain copy won
 * (benchmarks/small_collectives.py; docs/benchmarks-collectives.md). dst is 64-byte aligned. */
static void copy_in(char *dst, const char *src, Py_ssize_t n, Py_ssize_t nt_min)
{
    if (n < nt_min) {
        memcpy(dst, src, n);
        return;
    }
    Py_ssize_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
    _mm_sfence();  /* the streamed stores before the call number that publishes them */
}

/* ---------------------------------------------------------------- the board */
static void Board_dealloc(Board *self)
{
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Board_init(Board *self, PyObject *args, PyObject *kw)
{
    PyObject *seg;
    Py_ssize_t rank, size, slots, cap;
    if (!PyArg_ParseTuple(args, "Onnnn", &seg, &rank, &size, &slots, &cap))
        return -1;
    if (size < 1 || rank < 0 || rank >= size || slots < 2 || cap < 0 || cap % 64) {
        PyErr_SetString(PyExc_ValueError, "Board: bad rank, size, slots or capacity");
        return -1;
    }
    if (PyObject_GetBuffer(seg, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->stride = HEAD + slots * (ENTRY_HEAD + cap);
    if (self->view.len < size * self->stride || ((uintptr_t)self->view.buf & 63)) {
        PyBuffer_Release(&self->view);
        PyErr_SetString(PyExc_ValueError, "Board: the segment is too small or not aligned");
        return -1;
    }
    self->base = self->view.buf;
    self->rank = rank;
    self->size = size;
    self->slots = slots;
    self->cap = cap;
    self->pending = 0;
    self->spins = 0;
    self->yields = 0;
    self->nt_min = NT_MIN;
    self->nt_bcast = NT_BCAST;
    return 0;
}

static PyObject *Board_release(Board *self, PyObject *unused)
{
    if (self->view.obj != NULL)
        PyBuffer_Release(&self->view);
    self->base = NULL;
    Py_RETURN_NONE;
}

#define LIVE(self)                                                            \
    if ((self)->base == NULL) {                                               \
        PyErr_SetString(PyExc_ValueError, "the board was released");         \
        return NULL;                                                          \
    }

/* Write this member's entry for call s: 1, or 0 where a member still reads what the entry
 * holds (nothing written), or -1 with an exception set. */
static int do_post(Board *self, int64_t s, int64_t word, Py_ssize_t nbytes, PyObject *data_obj)
{
    int64_t *e = entry(self, self->rank, s);
    int64_t prev = e[0];
    if (prev > 0)  /* every member, this one too, has read the call the entry holds */
        for (Py_ssize_t r = 0; r < self->size; r++)
            if (LOAD(header(self, r) + 8) < prev)
                return 0;
    Py_buffer src = {0};
    if (data_obj != Py_None) {
        if (PyObject_GetBuffer(data_obj, &src, PyBUF_SIMPLE) < 0)
            return -1;
        if (src.len > self->cap || src.len != nbytes) {
            PyBuffer_Release(&src);
            PyErr_Format(PyExc_ValueError, "post: %zd bytes of data for a call of %zd (an entry "
                         "holds %zd)", src.len, nbytes, self->cap);
            return -1;
        }
    }
    STORE(e, (int64_t)-1);
    e[1] = word;
    e[2] = nbytes;
    if (src.obj != NULL) {
        /* a broadcast's one writer and many readers: streamed from a few KiB wherever the
         * cores sit (a 64 KiB one took 6.2 us streamed, 9.1 us plain where the cores were
         * close, and 3x raw MPI's plain where they were not) */
        Py_ssize_t nt = ((word >> 8) & 0xFF) == BCAST && self->nt_bcast < self->nt_min
                        ? self->nt_bcast : self->nt_min;
        copy_in(data(e), src.buf, src.len, nt);
        PyBuffer_Release(&src);
    }
    STORE(e, s);
    STORE(header(self, self->rank), s);
    return 1;
}

/* post(s, word, nbytes, data or None) -> bool: False where a member still reads the entry */
static PyObject *Board_post(Board *self, PyObject *const *args, Py_ssize_t nargs)
{
    LIVE(self);
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "post(s, word, nbytes, data)");
        return NULL;
    }
    int64_t s = PyLong_AsLongLong(args[0]), word = PyLong_AsLongLong(args[1]);
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[2]);
    if (PyErr_Occurred())
        return NULL;
    int ok = do_post(self, s, word, nbytes, args[3]);
    if (ok < 0)
        return NULL;
    return PyBool_FromLong(ok);
}

/* Read call s: 1 once the result is in out, 0 while a member has not posted it, -1 - r where
 * member r made it otherwise; -(size + 1) with an exception set. */
static long do_take(Board *self, int64_t s, int64_t word, Py_ssize_t nbytes, PyObject *out_obj,
                    long kind, long root, long dt, long op, long spins)
{
    const long failed = -(long)self->size - 1;
    long spun = 0, yielded = 0;
    /* A broadcast's other members read the root's entry only (and compare it with theirs);
     * its root reads no data but compares every entry all the same: members that each named
     * themselves the root would otherwise all return at once, each with its own data. */
    int only_root = kind == BCAST && root != self->rank;
    Py_ssize_t lo = only_root ? root : 0, hi = only_root ? root + 1 : self->size;
    /* Every pass looks at every member, so that a member whose words differ is named even
     * while one before it in rank order has not posted yet (its mismatch would otherwise wait
     * for that one, and the members that saw it first break the group meanwhile: the others
     * would read only their notice). */
    for (;;) {
        Py_ssize_t missing = 0;
        for (Py_ssize_t r = lo; r < hi; r++) {
            int64_t *e = entry(self, r, s);
            int64_t t = LOAD(e);
            if (t != s && (t > s || LOAD(header(self, r)) > s)) {
                if (LOAD(e) != s)  /* else posted between the two loads */
                    return -1 - (long)r;
            } else if (t != s) {
                missing++;
                continue;
            }
            if (e[1] != word || e[2] != nbytes)
                return -1 - (long)r;
        }
        if (missing == 0)
            break;
        if (spun++ >= spins) {
            if (yielded++ >= self->yields)
                return 0;
            /* where ranks outnumber cores: a yield in C, not in the caller's Python (whose
             * tests and yields cost the ranks with work the core: 4 ranks on 2 cores, an
             * all_gather of 16 B took 17-20 us a call so, 10-12 us so) */
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
            if (self->base == NULL) {  /* released by another thread meanwhile */
                PyErr_SetString(PyExc_ValueError, "the board was released");
                return failed;
            }
            continue;
        }
        __builtin_ia32_pause();
    }
    Py_buffer out = {0};
    if (out_obj != Py_None && PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) < 0)
        return failed;
    char *dst = out.buf;
    Py_ssize_t need = kind == GATHER ? nbytes * self->size
                      : kind == REDUCE_PART ? nbytes / self->size : nbytes;
    if (out.obj != NULL && out.len != need) {
        PyBuffer_Release(&out);
        PyErr_Format(PyExc_ValueError, "take: the output holds %zd bytes, not %zd", out.len, need);
        return failed;
    }
    int bad = 0;
    if (dst != NULL) {
        if (kind == GATHER) {
            for (Py_ssize_t r = 0; r < self->size; r++)
                memcpy(dst + r * nbytes, data(entry(self, r, s)), nbytes);
        } else if (kind == BCAST) {
            memcpy(dst, data(entry(self, root, s)), nbytes);
        } else {  /* REDUCE, REDUCE_PART, and ROOTED on its root */
            Py_ssize_t off = kind == REDUCE_PART ? self->rank * need : 0;
            memcpy(dst, data(entry(self, 0, s)) + off, need);
            for (Py_ssize_t r = 1; r < self->size && !bad; r++)
                bad = combine(dst, data(entry(self, r, s)) + off, need, (int)dt, (int)op);
        }
        PyBuffer_Release(&out);
    }
    if (bad) {
        PyErr_Format(PyExc_ValueError, "take: no reduction %ld for dtype %ld", op, dt);
        return failed;
    }
    STORE(header(self, self->rank) + 8, s);
    return 1;
}

#define TAKE_ARGS(i)                                                                          \
    int64_t s = PyLong_AsLongLong(args[0]), word = PyLong_AsLongLong(args[1]);               \
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[2]);                                            \
    long kind = PyLong_AsLong(args[(i)]), root = PyLong_AsLong(args[(i) + 1]);                \
    long dt = PyLong_AsLong(args[(i) + 2]), op = PyLong_AsLong(args[(i) + 3]);                \
    long spins = PyLong_AsLong(args[(i) + 4]);                                                \
    if (PyErr_Occurred())                                                                     \
        return NULL

/* take(s, word, nbytes, out or None, kind, root, dtype, op, spins) -> 1 done, 0 not yet,
 * -1 - r: member r made call s otherwise */
static PyObject *Board_take(Board *self, PyObject *const *args, Py_ssize_t nargs)
{
    LIVE(self);
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "take(s, word, nbytes, out, kind, root, dtype, op, spins)");
        return NULL;
    }
    TAKE_ARGS(4);
    long r = do_take(self, s, word, nbytes, args[3], kind, root, dt, op, spins);
    return r == -(long)self->size - 1 ? NULL : PyLong_FromLong(r);
}

/* run(s, word, nbytes, data, out, kind, root, dtype, op, spins): post then take; -(size + 2)
 * where the entry is still read (nothing written), else what take answers */
static PyObject *Board_run(Board *self, PyObject *const *args, Py_ssize_t nargs)
{
    LIVE(self);
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError,
                        "run(s, word, nbytes, data, out, kind, root, dtype, op, spins)");
        return NULL;
    }
    TAKE_ARGS(5);
    int ok = do_post(self, s, word, nbytes, args[3]);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        return PyLong_FromLong(-(long)self->size - 2);
    long r = do_take(self, s, word, nbytes, args[4], kind, root, dt, op, spins);
    return r == -(long)self->size - 1 ? NULL : PyLong_FromLong(r);
}

/* time_calls(first, rounds, nbytes, nt_min, limit_s) -> seconds, or -1.0 past limit_s:
 * calls first .. first + rounds - 1 as all-gathers of nbytes each, posted with nt_min, on a
 * board kept for this (shm_tiny._copy_choice: which copy_in the group's board uses). Every
 * member runs the same calls at once; each reads every entry, as a reduction does. */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static PyObject *Board_time_calls(Board *self, PyObject *args)
{
    LIVE(self);
    long long first;
    Py_ssize_t rounds, nbytes, nt_min;
    double limit;
    if (!PyArg_ParseTuple(args, "Lnnnd", &first, &rounds, &nbytes, &nt_min, &limit))
        return NULL;
    if (first < 1 || rounds < 1 || nbytes < 1 || nbytes > self->cap) {
        PyErr_SetString(PyExc_ValueError, "time_calls: bad call numbers or byte count");
        return NULL;
    }
    PyObject *src = PyByteArray_FromStringAndSize(NULL, nbytes);
    PyObject *out = PyByteArray_FromStringAndSize(NULL, nbytes * self->size);
    if (src == NULL || out == NULL) {
        Py_XDECREF(src);
        Py_XDECREF(out);
        return NULL;
    }
    memset(PyByteArray_AS_STRING(src), (int)self->rank + 1, nbytes);
    Py_ssize_t keep = self->nt_min;
    self->nt_min = nt_min;
    double t0 = now_s(), spent = -1.0;
    int64_t s = first;
    for (; s < first + rounds; s++) {
        long r = 0;
        int ok;
        while ((ok = do_post(self, s, 0, nbytes, src)) == 0 && now_s() - t0 < limit)
            __builtin_ia32_pause();
        if (ok == 1)
            while ((r = do_take(self, s, 0, nbytes, out, GATHER, 0, 0, 0, 1024)) == 0
                   && now_s() - t0 < limit)
                ;
        if (ok != 1 || r != 1)
            break;
    }
    if (s == first + rounds)
        spent = now_s() - t0;
    self->nt_min = keep;
    Py_DECREF(src);
    Py_DECREF(out);
    if (PyErr_Occurred())
        return NULL;
    return PyFloat_FromDouble(spent);
}

/* ---------------------------------------------------------------- a call's spec */
/* One kind and size of call on a board (shm_tiny.Call's): run(s, data, out) posts and takes
 * with the board's spins, where no call of this member is still to be read. */
typedef struct {
    PyObject_HEAD
    Board *board;
    PyObject *owner;
    int64_t word;
    Py_ssize_t nbytes;
    long kind, root, dt, op;
} Spec;

/* A spec and the Python call that owns it refer to each other: the collector must see the
 * spec's references, or every call the cache let go would live on with its buffers. */
static int Spec_traverse(Spec *self, visitproc visit, void *arg)
{
    Py_VISIT(self->board);
    Py_VISIT(self->owner);
    return 0;
}

static int Spec_clear(Spec *self)
{
    Py_CLEAR(self->owner);
    Py_CLEAR(self->board);
    return 0;
}

static void Spec_dealloc(Spec *self)
{
    PyObject_GC_UnTrack(self);
    Spec_clear(self);
    PyObject_GC_Del(self);
}

static PyObject *Spec_run(Spec *self, PyObject *const *args, Py_ssize_t nargs)
{
    Board *b = self->board;
    if (b == NULL) {
        PyErr_SetString(PyExc_ValueError, "the spec was cleared");
        return NULL;
    }
    LIVE(b);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "run(s, data, out)");
        return NULL;
    }
    int64_t s = PyLong_AsLongLong(args[0]);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    if (b->pending > 0)
        return PyLong_FromLong(-(long)b->size - 2);
    int ok = do_post(b, s, self->word, self->nbytes, args[1]);
    if (ok < 0)
        return NULL;
    if (ok == 0)
        return PyLong_FromLong(-(long)b->size - 2);
    long r = do_take(b, s, self->word, self->nbytes, args[2], self->kind, self->root, self->dt,
                     self->op, b->spins);
    return r == -(long)b->size - 1 ? NULL : PyLong_FromLong(r);
}

static PyMethodDef Spec_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Spec_run, METH_FASTCALL,
     "run(s, data, out): post call s and take it; 1 done, 0 posted and not yet read, -1 - r "
     "where member r made it otherwise, -(size + 2) where nothing was done (a call of this "
     "member still to read, or an entry a member still reads)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Spec_members[] = {
    {"owner", T_OBJECT, offsetof(Spec, owner), READONLY, "the Python call it belongs to"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject SpecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpitensor.distributed.backends.mpi._tiny.Spec",
    .tp_basicsize = sizeof(Spec),
    .tp_dealloc = (destructor)Spec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Spec_traverse,
    .tp_clear = (inquiry)Spec_clear,
    .tp_doc = "A kind and size of call on a board (Board.spec).",
    .tp_methods = Spec_methods,
    .tp_members = Spec_members,
};

/* spec(owner, word, nbytes, kind, root, dtype, op) -> Spec */
static PyObject *Board_spec(Board *self, PyObject *args)
{
    PyObject *owner;
    long long word;
    Py_ssize_t nbytes;
    long kind, root, dt, op;
    if (!PyArg_ParseTuple(args, "OLnllll", &owner, &word, &nbytes, &kind, &root, &dt, &op))
        return NULL;
    Spec *sp = PyObject_GC_New(Spec, &SpecType);
    if (sp == NULL)
        return NULL;
    Py_INCREF(self);
    Py_INCREF(owner);
    sp->board = self;
    sp->owner = owner;
    sp->word = word;
    sp->nbytes = nbytes;
    sp->kind = kind;
    sp->root = root;
    sp->dt = dt;
    sp->op = op;
    PyObject_GC_Track(sp);
    return (PyObject *)sp;
}

/* peek(s) -> the first other member whose entry holds call s, or -1; -1 also where this
 * member's own entry holds it (it makes call s here too) */
static PyObject *Board_peek(Board *self, PyObject *arg)
{
    LIVE(self);
    int64_t s = PyLong_AsLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    if (LOAD(entry(self, self->rank, s)) == s)
        return PyLong_FromLong(-1);
    for (Py_ssize_t r = 0; r < self->size; r++)
        if (r != self->rank && LOAD(entry(self, r, s)) == s)
            return PyLong_FromLong((long)r);
    return PyLong_FromLong(-1);
}

/* words(r, s) -> (entry's call number, operation word, byte count, header's posted, done) */
static PyObject *Board_words(Board *self, PyObject *args)
{
    LIVE(self);
    Py_ssize_t r;
    long long s;
    if (!PyArg_ParseTuple(args, "nL", &r, &s))
        return NULL;
    if (r < 0 || r >= self->size) {
        PyErr_SetString(PyExc_IndexError, "words: no such member");
        return NULL;
    }
    int64_t *e = entry(self, r, s), *h = header(self, r);
    return Py_BuildValue("LLLLL", (long long)LOAD(e), (long long)e[1], (long long)e[2],
                         (long long)LOAD(h), (long long)LOAD(h + 8));
}

/* pid(r) -> member r's process id (0 before it wrote it); set_pid(pid) writes this member's */
static PyObject *Board_pid(Board *self, PyObject *arg)
{
    LIVE(self);
    Py_ssize_t r = PyLong_AsSsize_t(arg);
    if (PyErr_Occurred())
        return NULL;
    if (r < 0 || r >= self->size) {
        PyErr_SetString(PyExc_IndexError, "pid: no such member");
        return NULL;
    }
    return PyLong_FromLongLong(LOAD(header(self, r) + 9));
}

static PyObject *Board_set_pid(Board *self, PyObject *arg)
{
    LIVE(self);
    long long pid = PyLong_AsLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    STORE(header(self, self->rank) + 9, (int64_t)pid);
    Py_RETURN_NONE;
}

static PyMethodDef Board_methods[] = {
    {"post", (PyCFunction)(void (*)(void))Board_post, METH_FASTCALL,
     "post(s, word, nbytes, data or None): write this member's entry for call s; False "
     "where a member still reads what the entry holds (nothing written)."},
    {"take", (PyCFunction)(void (*)(void))Board_take, METH_FASTCALL,
     "take(s, word, nbytes, out, kind, root, dtype, op, spins): 1 once call s's result is in "
     "out, 0 while a member has not posted it, -1 - r where member r made it otherwise."},
    {"run", (PyCFunction)(void (*)(void))Board_run, METH_FASTCALL,
     "run(s, word, nbytes, data, out, kind, root, dtype, op, spins): post, then take; "
     "-(size + 2) where a member still reads the entry (nothing written)."},
    {"time_calls", (PyCFunction)Board_time_calls, METH_VARARGS,
     "time_calls(first, rounds, nbytes, nt_min, limit_s): seconds that many all-gathers "
     "took, posted with nt_min; -1.0 past limit_s (a member that is not there)."},
    {"spec", (PyCFunction)Board_spec, METH_VARARGS,
     "spec(owner, word, nbytes, kind, root, dtype, op): a kind and size of call, to run."},
    {"peek", (PyCFunction)Board_peek, METH_O,
     "peek(s): a member that posted call s here while this one did not, or -1."},
    {"words", (PyCFunction)Board_words, METH_VARARGS,
     "words(r, s): member r's entry for call s and its header, for error messages."},
    {"pid", (PyCFunction)Board_pid, METH_O, "pid(r): member r's process id."},
    {"set_pid", (PyCFunction)Board_set_pid, METH_O, "set_pid(pid): this member's process id."},
    {"release", (PyCFunction)Board_release, METH_NOARGS, "Let go of the segment."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Board_members[] = {
    {"pending", T_PYSSIZET, offsetof(Board, pending), 0,
     "calls of this member posted and not yet read (a Spec's run refuses while any is)"},
    {"spins", T_LONG, offsetof(Board, spins), 0, "spins of a Spec's run before it answers 0"},
    {"yields", T_LONG, offsetof(Board, yields), 0,
     "then yields of the core (sched_yield, the GIL let go), of any take, before it answers 0"},
    {"nt_min", T_PYSSIZET, offsetof(Board, nt_min), 0,
     "posts of at least this many bytes copy their data with non-temporal stores"},
    {"nt_bcast", T_PYSSIZET, offsetof(Board, nt_bcast), 0,
     "a broadcast root's posts of at least this many bytes do too (whatever nt_min)"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject BoardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpitensor.distributed.backends.mpi._tiny.Board",
    .tp_basicsize = sizeof(Board),
    .tp_dealloc = (destructor)Board_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Board(segment, rank, size, slots, cap): small collectives in shared memory.",
    .tp_methods = Board_methods,
    .tp_members = Board_members,
    .tp_init = (initproc)Board_init,
    .tp_new = PyType_GenericNew,
};

/* ---- the engine's guarded writes into a peer's buffer (shm_direct.py) ----
 * A member that leaves a direct call early (an error) stores the call's step in its CLOSED
 * word, then waits while a peer's BUSY word holds that step. A writer stores the step in its
 * BUSY word, then loads the peer's CLOSED word, and writes only where it does not hold the
 * step. Both stores and both loads are sequentially consistent: of the two members at least
 * one sees the other's store, so either the writer writes nothing or the leaver waits for the
 * write to end. No write lands in a buffer its owner has left. */
static int words_at(Py_buffer *q, Py_ssize_t a, Py_ssize_t b)
{
    Py_ssize_t n = q->len / 8;
    if (q->len % 8 || a < 0 || b < 0 || a >= n || b >= n) {
        PyErr_SetString(PyExc_ValueError, "a word outside the control words");
        return 0;
    }
    return 1;
}

static PyObject *tiny_put(PyObject *self, PyObject *args)
{
    Py_buffer q;
    Py_ssize_t busy, closed, nbytes;
    long long step;
    int pid;
    unsigned long long remote, local;
    if (!PyArg_ParseTuple(args, "w*nnLiKKn", &q, &busy, &closed, &step, &pid, &remote, &local,
                          &nbytes))
        return NULL;
    if (!words_at(&q, busy, closed)) {
        PyBuffer_Release(&q);
        return NULL;
    }
    int64_t *w = (int64_t *)q.buf;
    long err = 0;
    Py_BEGIN_ALLOW_THREADS
    __atomic_store_n(&w[busy], (int64_t)step, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&w[closed], __ATOMIC_SEQ_CST) == (int64_t)step)
        err = -1;
    while (!err && nbytes > 0) {
        struct iovec from = {(void *)(uintptr_t)local, (size_t)nbytes};
        struct iovec to = {(void *)(uintptr_t)remote, (size_t)nbytes};
        ssize_t got = process_vm_writev(pid, &from, 1, &to, 1, 0);
        if (got <= 0) {
            err = got < 0 ? errno : EFAULT;
            break;
        }
        local += (unsigned long long)got, remote += (unsigned long long)got, nbytes -= got;
    }
    __atomic_store_n(&w[busy], 0, __ATOMIC_SEQ_CST);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&q);
    return PyLong_FromLong(err);
}

static PyObject *tiny_close(PyObject *self, PyObject *args)
{
    Py_buffer q;
    Py_ssize_t closed;
    long long step;
    if (!PyArg_ParseTuple(args, "w*nL", &q, &closed, &step))
        return NULL;
    if (!words_at(&q, closed, closed)) {
        PyBuffer_Release(&q);
        return NULL;
    }
    __atomic_store_n((int64_t *)q.buf + closed, (int64_t)step, __ATOMIC_SEQ_CST);
    PyBuffer_Release(&q);
    Py_RETURN_NONE;
}

static PyMethodDef tiny_functions[] = {
    {"put", tiny_put, METH_VARARGS,
     "put(words, busy, closed, step, pid, remote, local, nbytes): write nbytes from this "
     "process's address local to process pid's address remote (process_vm_writev, the GIL let "
     "go), word busy of words holding step meanwhile, unless word closed holds step; 0 done, -1 "
     "closed (nothing written), else the errno of the failed write."},
    {"close", tiny_close, METH_VARARGS,
     "close(words, closed, step): word closed of words = step, sequentially consistent."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef tiny_module = {
    PyModuleDef_HEAD_INIT, "_tiny", "Small collectives through a shared board (shm_tiny.py).", -1,
    tiny_functions,
};

PyMODINIT_FUNC PyInit__tiny(void)
{
    if (PyType_Ready(&BoardType) < 0 || PyType_Ready(&SpecType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&tiny_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&BoardType);
    if (PyModule_AddObject(m, "Board", (PyObject *)&BoardType) < 0) {
        Py_DECREF(&BoardType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "HEAD", HEAD);
    PyModule_AddIntConstant(m, "ENTRY_HEAD", ENTRY_HEAD);
    PyModule_AddIntConstant(m, "NT_MIN", NT_MIN);
    PyModule_AddIntConstant(m, "NT_BCAST", NT_BCAST);
    return m;
}
