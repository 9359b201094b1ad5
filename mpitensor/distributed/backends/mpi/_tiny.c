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

/* Whether this member may write its entry for call s: every member, this one too, has read
 * the call the entry holds. */
static int may_post(Board *self, int64_t s)
{
    int64_t prev = entry(self, self->rank, s)[0];
    if (prev > 0)
        for (Py_ssize_t r = 0; r < self->size; r++)
            if (LOAD(header(self, r) + 8) < prev)
                return 0;
    return 1;
}

/* Write this member's entry for call s (may_post said so) from src, len bytes (NULL: none). */
static void post_raw(Board *self, int64_t s, int64_t word, Py_ssize_t nbytes, const char *src,
                     Py_ssize_t len)
{
    int64_t *e = entry(self, self->rank, s);
    STORE(e, (int64_t)-1);
    e[1] = word;
    e[2] = nbytes;
    if (src != NULL) {
        /* a broadcast's one writer and many readers: streamed from nt_bcast, which the
         * group's timing sets (a 64 KiB one took 6.2 us streamed, 9.1 us plain on an EPYC
         * where the cores were close, 3x raw MPI's plain where they were not; 9.9 streamed,
         * 6.8 plain on a 2-core VM: shm_tiny.BCAST_TIMED) */
        Py_ssize_t nt = ((word >> 8) & 0xFF) == BCAST && self->nt_bcast < self->nt_min
                        ? self->nt_bcast : self->nt_min;
        copy_in(data(e), src, len, nt);
    }
    STORE(e, s);
    STORE(header(self, self->rank), s);
}

/* Write this member's entry for call s: 1, or 0 where a member still reads what the entry
 * holds (nothing written), or -1 with an exception set. */
static int do_post(Board *self, int64_t s, int64_t word, Py_ssize_t nbytes, PyObject *data_obj)
{
    if (!may_post(self, s))
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
    post_raw(self, s, word, nbytes, src.buf, src.len);
    if (src.obj != NULL)
        PyBuffer_Release(&src);
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

/* Wait (spins, then yields) until every member's entry holds call s with this word and byte
 * count: 1, 0 while a member has not posted it, -1 - r where member r made it otherwise, or
 * -(size + 1) with an exception set. */
static long take_wait(Board *self, int64_t s, int64_t word, Py_ssize_t nbytes, long kind,
                      long root, long spins)
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
    return 1;
}

/* The result of call s (every member posted it: take_wait) into dst, len bytes (NULL: none),
 * in rank order; then this member's "done" word. 1, or -(size + 1) with an exception set. */
static long take_into(Board *self, int64_t s, Py_ssize_t nbytes, char *dst, Py_ssize_t len,
                      long kind, long root, long dt, long op)
{
    const long failed = -(long)self->size - 1;
    Py_ssize_t need = kind == GATHER ? nbytes * self->size
                      : kind == REDUCE_PART ? nbytes / self->size : nbytes;
    if (dst != NULL && len != need) {
        PyErr_Format(PyExc_ValueError, "take: the output holds %zd bytes, not %zd", len, need);
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
    }
    if (bad) {
        PyErr_Format(PyExc_ValueError, "take: no reduction %ld for dtype %ld", op, dt);
        return failed;
    }
    STORE(header(self, self->rank) + 8, s);
    return 1;
}

/* Read call s: 1 once the result is in out, 0 while a member has not posted it, -1 - r where
 * member r made it otherwise; -(size + 1) with an exception set. */
static long do_take(Board *self, int64_t s, int64_t word, Py_ssize_t nbytes, PyObject *out_obj,
                    long kind, long root, long dt, long op, long spins)
{
    long r = take_wait(self, s, word, nbytes, kind, root, spins);
    if (r != 1)
        return r;
    Py_buffer out = {0};
    if (out_obj != Py_None && PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) < 0)
        return -(long)self->size - 1;
    r = take_into(self, s, nbytes, out.buf, out.len, kind, root, dt, op);
    if (out.obj != NULL)
        PyBuffer_Release(&out);
    return r;
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

/* time_calls(first, rounds, nbytes, nt_min, limit_s[, kind]) -> seconds, or -1.0 past
 * limit_s: calls first .. first + rounds - 1 as all-gathers (kind GATHER: each member reads
 * every entry, as a reduction does), broadcasts from member 0 (BCAST) or reduce-scatters of
 * float32 sums (REDUCE_PART: each member reduces its part of every entry) of nbytes each,
 * posted with nt_min, on a board kept for this (shm_tiny._copy_choice: which copy_in the
 * group's board uses; msg_choice.choose: which calls it takes). Every member runs the same
 * calls at once. */
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
    long kind = GATHER;
    if (!PyArg_ParseTuple(args, "Lnnnd|l", &first, &rounds, &nbytes, &nt_min, &limit, &kind))
        return NULL;
    int part = kind == REDUCE_PART;
    if (first < 1 || rounds < 1 || nbytes < 1 || nbytes > self->cap
        || (kind != GATHER && kind != BCAST && !part)
        || (part && nbytes % (4 * self->size) != 0)) {
        PyErr_SetString(PyExc_ValueError, "time_calls: bad call numbers, byte count or kind");
        return NULL;
    }
    /* a broadcast's: member 0 posts and reads nothing, the others post nothing and read */
    int bc = kind == BCAST, root = self->rank == 0;
    PyObject *src = PyByteArray_FromStringAndSize(NULL, nbytes);
    PyObject *out = PyByteArray_FromStringAndSize(
        NULL, bc ? nbytes : part ? nbytes / self->size : nbytes * self->size);
    if (src == NULL || out == NULL) {
        Py_XDECREF(src);
        Py_XDECREF(out);
        return NULL;
    }
    /* (a reduction's floats: zeros, never subnormal numbers, which some cores add slowly) */
    memset(PyByteArray_AS_STRING(src), part ? 0 : (int)self->rank + 1, nbytes);
    Py_ssize_t keep = self->nt_min;
    self->nt_min = nt_min;
    double t0 = now_s(), spent = -1.0;
    int64_t s = first;
    for (; s < first + rounds; s++) {
        long r = 0;
        int ok;
        while ((ok = do_post(self, s, 0, nbytes, bc && !root ? Py_None : src)) == 0
               && now_s() - t0 < limit)
            __builtin_ia32_pause();
        if (ok == 1)
            while ((r = do_take(self, s, 0, nbytes, bc && root ? Py_None : out, kind, 0, F32,
                                SUM, 1024)) == 0
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

/* ---------------------------------------------------------------- a group's lane */
/* A group's blocking calls on its board that took the Python fast path once before, kept by
 * kind, byte count, root, dtype and op (shm_tiny.Board.lane; Collectives' fast paths add to it
 * and ask it first). A call on the lane does in C what the fast path does in Python for such
 * a call, whose Python was about half of a call of a few bytes: what it must still check (the
 * buffers' layout, writability and overlap, the dtype and op, the group's state: its slow
 * flag, a fault notice in its shared word, an agreement check pending or due at this size, a
 * call of this member not yet read or an entry a member still reads), the call counted in the
 * group's history, then the post and the take. A call it cannot take, it leaves as it found
 * it (None): the Python fast path takes it, and raises what there is to raise. */
static PyTypeObject LaneType;

#define LANE_SLOTS 64 /* a power of two; cleared where half are used */
#define LANE_TYPES 32 /* dtypes and ops seen: codes 1 .. LANE_TYPES */

typedef struct {
    uint64_t key; /* 0: empty */
    PyObject *call; /* the group cache's call (its "active" flag: an async call in flight) */
    Spec *spec;
} LaneSlot;

typedef struct {
    PyObject_HEAD
    Board *board;
    PyObject *health, *history, *tensor_type, *array_type, *fault_obj;
    Py_buffer fault; /* the group's fault word, a view of fault_obj */
    PyObject *types[LANE_TYPES];
    Py_ssize_t ntypes;
    PyObject *names[5]; /* by kind: the operation's name, as the history holds it */
    PyObject *last;     /* the spec of the last call that did not end on the lane */
    int rooted;         /* whether calls with a root may take it (group ranks = world ranks) */
    Py_ssize_t used;
    LaneSlot slots[LANE_SLOTS];
} Lane;

static PyObject *s_seq, *s_slow, *s_fp_tok, *s_check_bytes, *s_active, *s_data, *s_dtype,
    *s_shape, *s_fast;

static uint64_t lane_key(long kind, Py_ssize_t nbytes, long root, Py_ssize_t dt, Py_ssize_t op)
{
    return 1u | (uint64_t)kind << 1 | (uint64_t)dt << 4 | (uint64_t)op << 10
           | (uint64_t)(root & 0xFFFF) << 16 | (uint64_t)nbytes << 32;
}

static LaneSlot *lane_slot(Lane *self, uint64_t key, int empty)
{
    size_t i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 58) & (LANE_SLOTS - 1);
    for (int n = 0; n < LANE_SLOTS; n++, i = (i + 1) & (LANE_SLOTS - 1)) {
        if (self->slots[i].key == key)
            return &self->slots[i];
        if (self->slots[i].key == 0)
            return empty ? &self->slots[i] : NULL;
    }
    return NULL;
}

/* the code of a dtype or op seen before (by identity; None: 0), or -1 */
static Py_ssize_t lane_code(Lane *self, PyObject *o)
{
    if (o == Py_None)
        return 0;
    for (Py_ssize_t i = 0; i < self->ntypes; i++)
        if (self->types[i] == o)
            return i + 1;
    return -1;
}

static void lane_empty(Lane *self)
{
    for (int i = 0; i < LANE_SLOTS; i++) {
        self->slots[i].key = 0;
        Py_CLEAR(self->slots[i].call);
        Py_CLEAR(self->slots[i].spec);
    }
    self->used = 0;
}

static int Lane_traverse(Lane *self, visitproc visit, void *arg)
{
    Py_VISIT(self->board);
    Py_VISIT(self->health);
    Py_VISIT(self->history);
    Py_VISIT(self->last);
    for (int i = 0; i < LANE_SLOTS; i++) {
        Py_VISIT(self->slots[i].call);
        Py_VISIT(self->slots[i].spec);
    }
    return 0;
}

static int Lane_clear(Lane *self)
{
    lane_empty(self);
    Py_CLEAR(self->board);
    Py_CLEAR(self->health);
    Py_CLEAR(self->history);
    Py_CLEAR(self->last);
    return 0;
}

static void Lane_dealloc(Lane *self)
{
    PyObject_GC_UnTrack(self);
    Lane_clear(self);
    if (self->fault.obj != NULL)
        PyBuffer_Release(&self->fault);
    Py_CLEAR(self->fault_obj);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->array_type);
    for (Py_ssize_t i = 0; i < self->ntypes; i++)
        Py_CLEAR(self->types[i]);
    for (int k = 0; k < 5; k++)
        Py_CLEAR(self->names[k]);
    PyObject_GC_Del(self);
}

/* lane(health, history, tensor_type, array_type, fault_word, names, rooted) -> Lane */
static PyObject *Board_lane(Board *self, PyObject *args)
{
    PyObject *health, *history, *tensor_type, *array_type, *fault, *names;
    int rooted;
    if (!PyArg_ParseTuple(args, "OO!OOOO!p", &health, &PyList_Type, &history, &tensor_type,
                          &array_type, &fault, &PyTuple_Type, &names, &rooted))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(history);
    if (PyTuple_GET_SIZE(names) != 5 || n < 1 || (n & (n - 1))) {
        PyErr_SetString(PyExc_ValueError, "lane: 5 names, a history of a power of two");
        return NULL;
    }
    Lane *ln = PyObject_GC_New(Lane, &LaneType);
    if (ln == NULL)
        return NULL;
    memset((char *)ln + sizeof(PyObject), 0, sizeof(Lane) - sizeof(PyObject));
    if (PyObject_GetBuffer(fault, &ln->fault, PyBUF_SIMPLE) < 0 || ln->fault.len < 8) {
        if (ln->fault.obj != NULL)
            PyBuffer_Release(&ln->fault);
        else
            PyErr_Clear();
        Py_DECREF(ln);
        PyErr_SetString(PyExc_ValueError, "lane: the fault word is not a buffer of 8 bytes");
        return NULL;
    }
    Py_INCREF(self);
    ln->board = self;
    ln->health = Py_NewRef(health);
    ln->history = Py_NewRef(history);
    ln->tensor_type = Py_NewRef(tensor_type);
    ln->array_type = Py_NewRef(array_type);
    ln->fault_obj = Py_NewRef(fault);
    for (int k = 0; k < 5; k++)
        ln->names[k] = Py_NewRef(PyTuple_GET_ITEM(names, k));
    ln->rooted = rooted;
    PyObject_GC_Track(ln);
    return (PyObject *)ln;
}

/* add(kind, nbytes, root, dtype, op or None, call): the call (its spec: call.fast) on the lane */
static PyObject *Lane_add(Lane *self, PyObject *args)
{
    long kind, root;
    Py_ssize_t nbytes;
    PyObject *dtype, *op, *call;
    if (!PyArg_ParseTuple(args, "lnlOOO", &kind, &nbytes, &root, &dtype, &op, &call))
        return NULL;
    if (kind < GATHER || kind > ROOTED || nbytes < 0 || root < 0)
        return PyErr_Format(PyExc_ValueError, "add: bad kind, byte count or root");
    if (root > 0xFFFF || nbytes > 0x7FFFFFFF || self->board == NULL)  /* (not in a key) */
        Py_RETURN_FALSE;
    PyObject *spec = PyObject_GetAttr(call, s_fast);
    if (spec == NULL)
        return NULL;
    if (Py_TYPE(spec) != &SpecType || ((Spec *)spec)->board != self->board) {
        Py_DECREF(spec);
        PyErr_SetString(PyExc_TypeError, "add: the call's fast spec is not one of this board");
        return NULL;
    }
    Py_ssize_t code[2];
    PyObject *o[2] = {dtype, op};
    for (int j = 0; j < 2; j++) {
        code[j] = lane_code(self, o[j]);
        if (code[j] < 0) {
            if (self->ntypes == LANE_TYPES) { /* (a program of that many dtypes and ops) */
                Py_DECREF(spec);
                Py_RETURN_FALSE;
            }
            self->types[self->ntypes++] = Py_NewRef(o[j]);
            code[j] = self->ntypes;
        }
    }
    uint64_t key = lane_key(kind, nbytes, root, code[0], code[1]);
    if (lane_slot(self, key, 0) == NULL && self->used >= LANE_SLOTS / 2)
        lane_empty(self);
    LaneSlot *sl = lane_slot(self, key, 1);
    if (sl->key == 0)
        self->used++;
    sl->key = key;
    Py_XSETREF(sl->call, Py_NewRef(call));
    Py_XSETREF(sl->spec, (Spec *)spec);
    Py_RETURN_TRUE;
}

static PyObject *Lane_empty(Lane *self, PyObject *unused)
{
    lane_empty(self);
    Py_RETURN_NONE;
}

/* close(): let go of the fault word (its segment may then close) and of every call */
static PyObject *Lane_close(Lane *self, PyObject *unused)
{
    if (self->fault.obj != NULL)
        PyBuffer_Release(&self->fault);
    Lane_clear(self);
    Py_RETURN_NONE;
}

/* The array a tensor argument holds (a new reference), or NULL: not an exact ndarray or a
 * Tensor holding one (no exception: the caller's path takes it). */
static PyObject *lane_array(Lane *self, PyObject *t)
{
    PyObject *a;
    if (Py_TYPE(t) == (PyTypeObject *)self->tensor_type) {
        a = PyObject_GetAttr(t, s_data);
        if (a == NULL) {
            PyErr_Clear();
            return NULL;
        }
    } else {
        a = Py_NewRef(t);
    }
    if (Py_TYPE(a) != (PyTypeObject *)self->array_type) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

/* a buffer of an array, C-contiguous (writable where asked), at least 1-d where asked: 1, or
 * 0 (no exception) */
static int lane_view(PyObject *a, Py_buffer *v, int writable, int nd)
{
    if (PyObject_GetBuffer(a, v, PyBUF_ND | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return 0;
    }
    if (nd && v->ndim < 1) {
        PyBuffer_Release(v);
        return 0;
    }
    return 1;
}

/* Whether the group lets call s of nbytes (the lane's slot sl) take the lane now: 1, 0, or -1
 * with an exception set. */
static int lane_open(Lane *self, LaneSlot *sl, Py_ssize_t nbytes, int64_t s)
{
    Board *b = self->board;
    if (b == NULL || b->base == NULL || b->pending > 0 || self->fault.obj == NULL
        || LOAD((int64_t *)self->fault.buf) != 0)
        return 0;
    PyObject *v = PyObject_GetAttr(self->health, s_slow);
    if (v == NULL)
        return -1;
    int ok = v == Py_False;
    Py_DECREF(v);
    if (!ok)
        return 0;
    if ((v = PyObject_GetAttr(self->health, s_fp_tok)) == NULL)
        return -1;
    ok = v == Py_None;
    Py_DECREF(v);
    if (!ok)
        return 0;
    if ((v = PyObject_GetAttr(self->health, s_check_bytes)) == NULL)
        return -1;
    long long most = PyLong_AsLongLong(v);
    Py_DECREF(v);
    if (most == -1 && PyErr_Occurred())
        return -1;
    if (nbytes >= most)
        return 0;
    if ((v = PyObject_GetAttr(sl->call, s_active)) == NULL)
        return -1;
    ok = v == Py_False;
    Py_DECREF(v);
    return ok && may_post(b, s);
}

/* Call s on the lane: counted (the group's seq, its history's entry from dtype and the shape
 * of hist), posted from src and taken into dst. What take answers (1: done; 0, or -1 - r,
 * for the Python wait: Lane.last), or NULL with an exception set. */
static PyObject *lane_run(Lane *self, PyObject *g, LaneSlot *sl, int64_t s, PyObject *hist,
                          PyObject *dtype, const char *src, Py_ssize_t srclen, char *dst,
                          Py_ssize_t dstlen)
{
    Board *b = self->board;
    Spec *sp = sl->spec;
    PyObject *sv = PyLong_FromLongLong(s);
    if (sv == NULL || PyObject_SetAttr(g, s_seq, sv) < 0) {
        Py_XDECREF(sv);
        return NULL;
    }
    PyObject *shape = PyObject_GetAttr(hist, s_shape);
    PyObject *e = shape == NULL ? NULL : PyTuple_Pack(4, sv, self->names[sp->kind], dtype, shape);
    Py_DECREF(sv);
    Py_XDECREF(shape);
    if (e == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(self->history);
    PyList_SetItem(self->history, (Py_ssize_t)(s & (n - 1)), e); /* (steals e) */
    post_raw(b, s, sp->word, sp->nbytes, src, srclen);
    long r = take_wait(b, s, sp->word, sp->nbytes, sp->kind, sp->root, b->spins);
    if (r == 1)
        r = take_into(b, s, sp->nbytes, dst, dstlen, sp->kind, sp->root, sp->dt, sp->op);
    if (r == -(long)b->size - 1)
        return NULL;
    if (r != 1)
        Py_XSETREF(self->last, Py_NewRef((PyObject *)sp));
    return PyLong_FromLong(r);
}

/* the group's next call number (its seq + 1), or -1 with an exception set */
static int64_t lane_next(PyObject *g)
{
    PyObject *v = PyObject_GetAttr(g, s_seq);
    if (v == NULL)
        return -1;
    long long s = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return s == -1 && PyErr_Occurred() ? -1 : (int64_t)s + 1;
}

/* The one-buffer calls: broadcast (root, no op), all_reduce (op), reduce (root and op). */
static PyObject *lane_one(Lane *self, PyObject *g, PyObject *t, long kind, PyObject *rootobj,
                          PyObject *op)
{
    Board *b = self->board;
    long root = 0;
    if (b == NULL)
        Py_RETURN_NONE;
    if (kind != REDUCE) {
        if (!self->rooted)
            Py_RETURN_NONE;
        if (rootobj != Py_None || kind == BCAST) {
            if (!PyLong_CheckExact(rootobj))
                Py_RETURN_NONE;
            root = PyLong_AsLong(rootobj);
            if (root == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                Py_RETURN_NONE;
            }
        }
        if (root < 0 || root >= b->size)
            Py_RETURN_NONE;
    }
    Py_ssize_t opc = kind == BCAST ? 0 : lane_code(self, op);
    if (opc < 0 || (kind != BCAST && opc == 0))
        Py_RETURN_NONE;
    PyObject *a = lane_array(self, t);
    if (a == NULL)
        Py_RETURN_NONE;
    PyObject *res = NULL, *dtype = NULL;
    int mine = root == b->rank, reads = kind == REDUCE || (kind == ROOTED) == mine;
    Py_buffer v;
    if (!lane_view(a, &v, reads, 0)) {
        Py_DECREF(a);
        Py_RETURN_NONE;
    }
    if ((dtype = PyObject_GetAttr(a, s_dtype)) == NULL)
        goto done;
    Py_ssize_t dtc = lane_code(self, dtype);
    LaneSlot *sl = dtc > 0 ? lane_slot(self, lane_key(kind, v.len, root, dtc, opc), 0) : NULL;
    int64_t s = sl == NULL ? 0 : lane_next(g);
    if (s < 0)
        goto done;
    int open = sl == NULL ? 0 : lane_open(self, sl, v.len, s);
    if (open < 0)
        goto done;
    if (open == 0) {
        res = Py_NewRef(Py_None);
        goto done;
    }
    /* a broadcast's root posts and reads nothing, the others read; a reduce's members post
     * and only its root reads; an all_reduce's members post and read */
    int posts = kind != BCAST || mine;
    res = lane_run(self, g, sl, s, a, dtype, posts ? v.buf : NULL, v.len,
                   reads ? v.buf : NULL, v.len);
done:
    PyBuffer_Release(&v);
    Py_XDECREF(dtype);
    Py_DECREF(a);
    return res;
}

static PyObject *Lane_broadcast(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "broadcast(group, tensor, src)");
        return NULL;
    }
    return lane_one(self, args[0], args[1], BCAST, args[2], Py_None);
}

static PyObject *Lane_all_reduce(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "all_reduce(group, tensor, op)");
        return NULL;
    }
    return lane_one(self, args[0], args[1], REDUCE, Py_None, args[2]);
}

static PyObject *Lane_reduce(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "reduce(group, tensor, dst, op)");
        return NULL;
    }
    return lane_one(self, args[0], args[1], ROOTED, args[2], args[3]);
}

/* The two-buffer calls: all_gather_into_tensor (no op) and reduce_scatter_tensor (op); out
 * and inp of one dtype, at least 1-d, apart in memory, out writable. */
static PyObject *lane_two(Lane *self, PyObject *g, PyObject *ot, PyObject *it, long kind,
                          PyObject *op)
{
    Board *b = self->board;
    Py_ssize_t opc = kind == GATHER ? 0 : lane_code(self, op);
    if (b == NULL || opc < 0 || (kind != GATHER && opc == 0))
        Py_RETURN_NONE;
    PyObject *o = lane_array(self, ot), *a = lane_array(self, it);
    PyObject *res = NULL, *dtype = NULL, *odt = NULL;
    Py_buffer ov = {0}, av = {0};
    if (o == NULL || a == NULL || o == a || !lane_view(o, &ov, 1, 1) || !lane_view(a, &av, 0, 1)) {
        res = Py_NewRef(Py_None);
        goto done;
    }
    const char *ob = ov.buf, *ab = av.buf;
    Py_ssize_t want = kind == GATHER ? av.len * b->size : ov.len * b->size;
    if ((kind == GATHER ? ov.len : av.len) != want || (ob < ab + av.len && ab < ob + ov.len)) {
        res = Py_NewRef(Py_None); /* (sizes the call does not take, or overlapping buffers) */
        goto done;
    }
    if ((dtype = PyObject_GetAttr(a, s_dtype)) == NULL || (odt = PyObject_GetAttr(o, s_dtype)) == NULL)
        goto done;
    Py_ssize_t dtc = dtype == odt ? lane_code(self, dtype) : -1;
    LaneSlot *sl = dtc > 0 ? lane_slot(self, lane_key(kind, av.len, 0, dtc, opc), 0) : NULL;
    int64_t s = sl == NULL ? 0 : lane_next(g);
    if (s < 0)
        goto done;
    int open = sl == NULL ? 0 : lane_open(self, sl, av.len, s);
    if (open < 0)
        goto done;
    if (open == 0) {
        res = Py_NewRef(Py_None);
        goto done;
    }
    res = lane_run(self, g, sl, s, a, dtype, av.buf, av.len, ov.buf, ov.len);
done:
    if (ov.obj != NULL)
        PyBuffer_Release(&ov);
    if (av.obj != NULL)
        PyBuffer_Release(&av);
    Py_XDECREF(dtype);
    Py_XDECREF(odt);
    Py_XDECREF(o);
    Py_XDECREF(a);
    return res;
}

static PyObject *Lane_all_gather(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "all_gather(group, output, input)");
        return NULL;
    }
    return lane_two(self, args[0], args[1], args[2], GATHER, Py_None);
}

static PyObject *Lane_reduce_scatter(Lane *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "reduce_scatter(group, output, input, op)");
        return NULL;
    }
    return lane_two(self, args[0], args[1], args[2], REDUCE_PART, args[3]);
}

#define LANE_CALL "; 1 done, 0 or -1 - r: posted and not ended (the spec: last), None: not taken"

static PyMethodDef Lane_methods[] = {
    {"add", (PyCFunction)Lane_add, METH_VARARGS,
     "add(kind, nbytes, root, dtype, op or None, call): the call's spec (call.fast) on the "
     "lane, by kind, bytes (a reduce-scatter's or all-gather's input), root, dtype and op; "
     "False where it cannot keep it (too many dtypes and ops already, a root or size past what "
     "a key holds, the lane closed)."},
    {"empty", (PyCFunction)Lane_empty, METH_NOARGS, "Take every call off the lane."},
    {"close", (PyCFunction)Lane_close, METH_NOARGS,
     "Let go of the fault word and every call: the lane takes no call from now on."},
    {"broadcast", (PyCFunction)(void (*)(void))Lane_broadcast, METH_FASTCALL,
     "broadcast(group, tensor, src)" LANE_CALL},
    {"all_reduce", (PyCFunction)(void (*)(void))Lane_all_reduce, METH_FASTCALL,
     "all_reduce(group, tensor, op)" LANE_CALL},
    {"reduce", (PyCFunction)(void (*)(void))Lane_reduce, METH_FASTCALL,
     "reduce(group, tensor, dst, op)" LANE_CALL},
    {"all_gather", (PyCFunction)(void (*)(void))Lane_all_gather, METH_FASTCALL,
     "all_gather(group, output, input)" LANE_CALL},
    {"reduce_scatter", (PyCFunction)(void (*)(void))Lane_reduce_scatter, METH_FASTCALL,
     "reduce_scatter(group, output, input, op)" LANE_CALL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Lane_members[] = {
    {"last", T_OBJECT, offsetof(Lane, last), READONLY,
     "the spec of the last call that did not end on the lane"},
    {"used", T_PYSSIZET, offsetof(Lane, used), READONLY, "calls on the lane"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpitensor.distributed.backends.mpi._tiny.Lane",
    .tp_basicsize = sizeof(Lane),
    .tp_dealloc = (destructor)Lane_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Lane_traverse,
    .tp_clear = (inquiry)Lane_clear,
    .tp_doc = "A group's blocking calls seen on its board, taken in C (Board.lane).",
    .tp_methods = Lane_methods,
    .tp_members = Lane_members,
};

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
     "time_calls(first, rounds, nbytes, nt_min, limit_s[, kind]): seconds that many "
     "all-gathers (or broadcasts from member 0: kind BCAST; float32 reduce-scatters: "
     "REDUCE_PART) took, posted with nt_min; -1.0 past limit_s (a member that is not there)."},
    {"spec", (PyCFunction)Board_spec, METH_VARARGS,
     "spec(owner, word, nbytes, kind, root, dtype, op): a kind and size of call, to run."},
    {"peek", (PyCFunction)Board_peek, METH_O,
     "peek(s): a member that posted call s here while this one did not, or -1."},
    {"words", (PyCFunction)Board_words, METH_VARARGS,
     "words(r, s): member r's entry for call s and its header, for error messages."},
    {"pid", (PyCFunction)Board_pid, METH_O, "pid(r): member r's process id."},
    {"set_pid", (PyCFunction)Board_set_pid, METH_O, "set_pid(pid): this member's process id."},
    {"release", (PyCFunction)Board_release, METH_NOARGS, "Let go of the segment."},
    {"lane", (PyCFunction)Board_lane, METH_VARARGS,
     "lane(health, history, tensor_type, array_type, fault_word, names, rooted): the group's "
     "lane on this board (names: the operations by kind; rooted: calls with a root take it)."},
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
    if (PyType_Ready(&BoardType) < 0 || PyType_Ready(&SpecType) < 0
        || PyType_Ready(&LaneType) < 0)
        return NULL;
    const char *words[] = {"seq", "slow", "fp_tok", "check_bytes", "active", "_data", "dtype",
                           "shape", "fast"};
    PyObject **into[] = {&s_seq, &s_slow, &s_fp_tok, &s_check_bytes, &s_active, &s_data,
                         &s_dtype, &s_shape, &s_fast};
    for (int i = 0; i < 9; i++)
        if ((*into[i] = PyUnicode_InternFromString(words[i])) == NULL)
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
    PyModule_AddIntConstant(m, "LANE_SLOTS", LANE_SLOTS);
    return m;
}
