/* mpitensor's compiled CPU loops (NumPy arrays only): conv2d's banded im2col loops and 2x2 max
 * pooling (mpitensor.nn._kernels.native loads them), and the copies of equal runs that DTensor
 * redistributions make (copy_runs, scatter_runs; mpitensor.distributed.tensor._direct).
 *
 * Why this exists: the same loops written as NumPy calls hand the interpreter lock back and
 * forth at every call, so two Python threads sharing a layer's work ran it slower than one
 * (measured: 0.62-0.93x for LeNet's convolutions). Here each thread's share is one call that
 * releases the lock for its whole duration: the im2col copies, the matrix products (the BLAS
 * that NumPy itself loaded, found by mpitensor.nn._kernels.native) and the input gradient's
 * scatter-adds all run without it.
 *
 * Layouts (as in nn/_kernels.py): the padded input ``src`` and the padded input gradient ``dx``
 * are (C, Hp, Wp, N), batch innermost; the output and its gradient are (O, OH*OW*N); an im2col
 * band holds rows (c, i, j) for c < C, i < kh, j < kw (then a row of ones for the bias when
 * ``rows`` is C*kh*kw + 1) and the band's output pixels (y, x, n) as columns. A band is four
 * int64s of ``plan``: output rows y0..y1 and columns x0..x1 (whole rows, or a part of one).
 *
 * Every entry point checks the buffers it is handed against the sizes before touching them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };

/* CBLAS ?gemm with 64-bit integers (an ILP64 build of the library, as NumPy's wheels ship:
 * mpitensor.nn._kernels.native takes no 32-bit one, whose sizes a large layer could overflow). */
typedef void (*sgemm_t)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                        const float *, int64_t, const float *, int64_t, float, float *,
                        int64_t);
typedef void (*dgemm_t)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                        const double *, int64_t, const double *, int64_t, double, double *,
                        int64_t);

typedef struct {
    void *fn;
    int itemsize;
} Gemm;

static void gemm(const Gemm *g, int ta, int tb, int64_t m, int64_t n, int64_t k,
                 const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                 void *c, int64_t ldc)
{
    if (g->itemsize == 4)
        ((sgemm_t)g->fn)(ROW_MAJOR, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, (float)beta, c, ldc);
    else
        ((dgemm_t)g->fn)(ROW_MAJOR, ta, tb, m, n, k, 1.0, a, lda, b, ldb, beta, c, ldc);
}

typedef struct {
    int64_t C, Hp, Wp, N, O, kh, kw, sh, sw, dh, dw, OH, OW, rows;
} Geom;

static int parse_geom(PyObject *t, Geom *g)
{
    int64_t v[14];
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 14) {
        PyErr_SetString(PyExc_ValueError, "geometry: a tuple of 14 ints");
        return -1;
    }
    for (int i = 0; i < 14; i++) {
        v[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
        if (v[i] == -1 && PyErr_Occurred())
            return -1;
        if (v[i] < 1) {  /* every size, stride and dilation */
            PyErr_SetString(PyExc_ValueError, "geometry: sizes must be positive");
            return -1;
        }
    }
    g->C = v[0]; g->Hp = v[1]; g->Wp = v[2]; g->N = v[3]; g->O = v[4]; g->kh = v[5];
    g->kw = v[6]; g->sh = v[7]; g->sw = v[8]; g->dh = v[9]; g->dw = v[10]; g->OH = v[11];
    g->OW = v[12]; g->rows = v[13];
    int64_t K = g->C * g->kh * g->kw;
    if ((g->rows != K && g->rows != K + 1)
        || (g->OH - 1) * g->sh + (g->kh - 1) * g->dh >= g->Hp
        || (g->OW - 1) * g->sw + (g->kw - 1) * g->dw >= g->Wp) {
        PyErr_SetString(PyExc_ValueError, "geometry: inconsistent sizes");
        return -1;
    }
    return 0;
}

static int parse_gemm(PyObject *t, int itemsize, Gemm *g)
{
    unsigned long long addr;
    int ilp64;
    if (!PyArg_ParseTuple(t, "Kp", &addr, &ilp64))
        return -1;
    if (!addr) {
        PyErr_SetString(PyExc_ValueError, "gemm: null address");
        return -1;
    }
    if (!ilp64) {
        PyErr_SetString(PyExc_ValueError, "gemm: a 64-bit integer CBLAS only");
        return -1;
    }
    g->fn = (void *)(uintptr_t)addr;
    g->itemsize = itemsize;
    return 0;
}

/* The bands b0..b1 of ``plan``, checked against the geometry; their widest column count. */
static int check_plan(const Py_buffer *plan, int64_t b0, int64_t b1, const Geom *g,
                      int64_t *widest)
{
    const int64_t *p = plan->buf;
    if (plan->itemsize != 8 || plan->len % 32 || b0 < 0 || b1 < b0
        || b1 > plan->len / 32) {
        PyErr_SetString(PyExc_ValueError, "plan: int64 (bands, 4) and a range within it");
        return -1;
    }
    *widest = 0;
    for (int64_t b = b0; b < b1; b++) {
        int64_t y0 = p[4 * b], y1 = p[4 * b + 1], x0 = p[4 * b + 2], x1 = p[4 * b + 3];
        if (y0 < 0 || y1 <= y0 || y1 > g->OH || x0 < 0 || x1 <= x0 || x1 > g->OW
            || (y1 - y0 > 1 && (x0 != 0 || x1 != g->OW))) {
            PyErr_SetString(PyExc_ValueError, "plan: a band outside the output");
            return -1;
        }
        int64_t w = (y1 - y0) * (x1 - x0) * g->N;
        if (w > *widest)
            *widest = w;
    }
    return 0;
}

static int need(const Py_buffer *b, int64_t items, int itemsize, const char *what)
{
    if (b->len < items * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: too small", what);
        return -1;
    }
    return 0;
}

/* im2col block of one band into ``buf`` (rows of ``ld`` items): rows c*kh*kw + i*kw + j. */
#define DEFINE_IM2COL(T)                                                                      \
    static void im2col_##T(const T *src, const Geom *g, const int64_t *band, T *buf,         \
                           int64_t ld)                                                        \
    {                                                                                          \
        int64_t y0 = band[0], y1 = band[1], x0 = band[2], x1 = band[3], N = g->N;            \
        int64_t run = (x1 - x0) * N;                                                           \
        for (int64_t c = 0; c < g->C; c++)                                                     \
            for (int64_t i = 0; i < g->kh; i++)                                                \
                for (int64_t j = 0; j < g->kw; j++) {                                          \
                    T *row = buf + ((c * g->kh + i) * g->kw + j) * ld;                         \
                    for (int64_t y = y0; y < y1; y++) {                                        \
                        const T *s = src + ((c * g->Hp + y * g->sh + i * g->dh) * g->Wp      \
                                            + x0 * g->sw + j * g->dw) * N;                     \
                        T *d = row + (y - y0) * run;                                           \
                        if (g->sw == 1) {                                                      \
                            memcpy(d, s, (size_t)run * sizeof(T));                             \
                        } else {                                                               \
                            for (int64_t x = 0; x < x1 - x0; x++)                              \
                                memcpy(d + x * N, s + x * g->sw * N, (size_t)N * sizeof(T));   \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
    }

DEFINE_IM2COL(float)
DEFINE_IM2COL(double)

/* dx[c, y*sh + i*dh, x*sw + j*dw, :] += D[(c - c0, i, j), (y, x, :)] for the band. */
#define DEFINE_COL2IM(T)                                                                      \
    static void col2im_##T(T *dx, const Geom *g, const int64_t *band, const T *D,            \
                           int64_t ld, int64_t c0, int64_t c1)                                \
    {                                                                                          \
        int64_t y0 = band[0], y1 = band[1], x0 = band[2], x1 = band[3], N = g->N;            \
        int64_t run = (x1 - x0) * N;                                                           \
        for (int64_t c = c0; c < c1; c++)                                                      \
            for (int64_t i = 0; i < g->kh; i++)                                                \
                for (int64_t j = 0; j < g->kw; j++) {                                          \
                    const T *row = D + (((c - c0) * g->kh + i) * g->kw + j) * ld;              \
                    for (int64_t y = y0; y < y1; y++) {                                        \
                        T *d = dx + ((c * g->Hp + y * g->sh + i * g->dh) * g->Wp              \
                                     + x0 * g->sw + j * g->dw) * N;                            \
                        const T *s = row + (y - y0) * run;                                     \
                        if (g->sw == 1) {                                                      \
                            for (int64_t k = 0; k < run; k++)                                  \
                                d[k] += s[k];                                                  \
                        } else {                                                               \
                            for (int64_t x = 0; x < x1 - x0; x++)                              \
                                for (int64_t n = 0; n < N; n++)                                \
                                    d[x * g->sw * N + n] += s[x * N + n];                      \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
    }

DEFINE_COL2IM(float)
DEFINE_COL2IM(double)

static int64_t band_start(const Geom *g, const int64_t *band)
{
    return (band[0] * g->OW + band[2]) * g->N;
}

static int64_t band_width(const Geom *g, const int64_t *band)
{
    return (band[1] - band[0]) * (band[3] - band[2]) * g->N;
}

/* One call of the three conv entry points: (first, second, third, geom, plan, r0, r1, buf,
 * gemm, itemsize), the buffers in that order, r0..r1 a range of bands or of channels. */
typedef struct {
    Py_buffer a, b, c, plan, buf;
    Py_ssize_t r0, r1;
    int it;
    Geom g;
    Gemm k;
    int64_t widest;
} Call;

static void release(Call *c)
{
    PyBuffer_Release(&c->a); PyBuffer_Release(&c->b); PyBuffer_Release(&c->c);
    PyBuffer_Release(&c->plan); PyBuffer_Release(&c->buf);
}

/* Parse and check a call; ``bands``: r0..r1 is the range of plan's bands to check (else all
 * of them are, and r0..r1 is left to the caller). On failure, nothing is held. */
static int conv_args(PyObject *args, Call *c, int bands)
{
    PyObject *geom, *gm;
    if (!PyArg_ParseTuple(args, "y*y*w*O!y*nnw*O!i", &c->a, &c->b, &c->c, &PyTuple_Type, &geom,
                          &c->plan, &c->r0, &c->r1, &c->buf, &PyTuple_Type, &gm, &c->it))
        return -1;
    int64_t nb = c->plan.len / 32;
    if (c->it != 4 && c->it != 8) {
        PyErr_SetString(PyExc_ValueError, "float32 or float64 only");
    } else if (!parse_geom(geom, &c->g) && !parse_gemm(gm, c->it, &c->k)
               && !check_plan(&c->plan, bands ? c->r0 : 0, bands ? c->r1 : nb, &c->g,
                              &c->widest)) {
        return 0;
    }
    release(c);
    return -1;
}

/* forward and weight_grad: each band's im2col block is built in buf, then multiplied into
 * the output (forward: out[:, band] = wext @ block) or into the weight gradient
 * (acc += gc[:, band] @ block.T). Returns -1 with an exception set on bad sizes. */
static int im2col_bands(Call *c, int wgrad)
{
    const Geom *g = &c->g;
    int it = c->it;
    int64_t widest = c->widest, M = g->OH * g->OW * g->N, small = g->O * g->rows;
    if (need(&c->a, g->C * g->Hp * g->Wp * g->N, it, "src")
        || need(&c->b, wgrad ? g->O * M : small, it, wgrad ? "gc" : "wext")
        || need(&c->c, wgrad ? small : g->O * M, it, wgrad ? "acc" : "out")
        || need(&c->buf, g->rows * widest, it, "buf"))
        return -1;
    const int64_t *p = c->plan.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = c->r0; b < c->r1; b++) {
        const int64_t *band = p + 4 * b;
        if (it == 4)
            im2col_float(c->a.buf, g, band, c->buf.buf, widest);
        else
            im2col_double(c->a.buf, g, band, c->buf.buf, widest);
        int64_t at = band_start(g, band) * it, w = band_width(g, band);
        if (wgrad)
            gemm(&c->k, NO_TRANS, TRANS, g->O, g->rows, w, (const char *)c->b.buf + at, M,
                 c->buf.buf, widest, 1.0, c->c.buf, g->rows);
        else
            gemm(&c->k, NO_TRANS, NO_TRANS, g->O, w, g->rows, c->b.buf, g->rows, c->buf.buf,
                 widest, 0.0, (char *)c->c.buf + at, M);
    }
    Py_END_ALLOW_THREADS
    return 0;
}

static const char forward_doc[] =
    "forward(src, wext, out, geom, plan, b0, b1, buf, gemm, itemsize)\n\n"
    "out[:, band] = wext (O, rows) @ im2col(band) for the bands b0..b1 of plan; buf holds\n"
    "(rows, widest band) items, its bias row (if any) already all ones.";

static const char weight_grad_doc[] =
    "weight_grad(src, gc, acc, geom, plan, b0, b1, buf, gemm, itemsize)\n\n"
    "acc (O, rows) += gc[:, band] @ im2col(band).T over the bands b0..b1 of plan (the bias\n"
    "column, if any, from the all-ones row of buf).";

static const char input_grad_doc[] =
    "input_grad(gc, wext, dx, geom, plan, c0, c1, dbuf, gemm, itemsize)\n\n"
    "For every band of plan: D = wext[:, rows of channels c0..c1].T @ gc[:, band], added into\n"
    "the padded (C, Hp, Wp, N) input gradient dx at each kernel offset; only channels c0..c1 of\n"
    "dx are written, so threads with disjoint channel ranges may share dx.";

/* input_grad's loop over every band (channels r0..r1 of dx); -1 with an exception set on bad
 * channels or sizes. */
static int col2im_bands(Call *c, int unused)
{
    const Geom *g = &c->g;
    int it = c->it;
    int64_t widest = c->widest, M = g->OH * g->OW * g->N, kk = g->kh * g->kw;
    int64_t c0 = c->r0, c1 = c->r1, nb = c->plan.len / 32;
    (void)unused;
    if (c0 < 0 || c1 <= c0 || c1 > g->C) {
        PyErr_SetString(PyExc_ValueError, "channels outside the input");
        return -1;
    }
    if (need(&c->a, g->O * M, it, "gc") || need(&c->b, g->O * g->rows, it, "wext")
        || need(&c->c, g->C * g->Hp * g->Wp * g->N, it, "dx")
        || need(&c->buf, (c1 - c0) * kk * widest, it, "dbuf"))
        return -1;
    const int64_t *p = c->plan.buf;
    const char *wc = (const char *)c->b.buf + c0 * kk * it;  /* columns of channels c0.. */
    Py_BEGIN_ALLOW_THREADS
    for (int64_t b = 0; b < nb; b++) {
        const int64_t *band = p + 4 * b;
        const char *gb = (const char *)c->a.buf + band_start(g, band) * it;
        gemm(&c->k, TRANS, NO_TRANS, (c1 - c0) * kk, band_width(g, band), g->O, wc, g->rows, gb,
             M, 0.0, c->buf.buf, widest);
        if (it == 4)
            col2im_float(c->c.buf, g, band, c->buf.buf, widest, c0, c1);
        else
            col2im_double(c->c.buf, g, band, c->buf.buf, widest, c0, c1);
    }
    Py_END_ALLOW_THREADS
    return 0;
}

/* The three conv entry points: parse the call (for the two band loops r0..r1 is a range of
 * bands, checked), run the loop, release the buffers whatever happened. */
static PyObject *conv_entry(PyObject *args, int (*loop)(Call *, int), int wgrad)
{
    Call c;
    if (conv_args(args, &c, loop == im2col_bands))
        return NULL;
    int bad = loop(&c, wgrad);
    release(&c);
    if (bad)
        return NULL;
    Py_RETURN_NONE;
}

#define CONV_ENTRY(name, loop, wgrad)                                                         \
    static PyObject *name(PyObject *self, PyObject *args) { return conv_entry(args, loop, wgrad); }

CONV_ENTRY(forward, im2col_bands, 0)
CONV_ENTRY(weight_grad, im2col_bands, 1)
CONV_ENTRY(input_grad, col2im_bands, 0)

/* ---------------------------------------------------------------------------------------
 * 2x2 / stride-2 max pooling over a (C, H, W, N) input, as _kernels.maxpool2x2_forward does
 * with NumPy passes: the same values, the same winner code (row-major position in the window,
 * the first one on ties), NaN handled as NumPy's maximum and comparisons handle it.
 */

/* NumPy's maximum: a NaN in either operand wins, the first one if both. As a bitwise select
 * on four floats at a time (GCC/Clang vector extensions): written as a scalar ?: the compiler
 * kept a branch, which mispredicts half the time on real data (4.5 ms against NumPy's 0.4 for
 * LeNet's first pooling at batch 256; 0.22 ms this way, on one core). */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

static inline v4f np_max4(v4f a, v4f b)
{
    v4i m = (a >= b) | (a != a);
    return (v4f)((m & (v4i)a) | (~m & (v4i)b));
}

static inline float np_max1(float a, float b)
{
    return (a >= b || a != a) ? a : b;
}

typedef struct {
    int64_t C, H, W, N, oh, ow;
    int64_t sn, sc, si, sj; /* element strides of the (N, C, oh, ow) output or its gradient */
} Pool;

/* dims and strides read into p and checked against the strided buffer (other_len bytes,
 * named what), the channels c0..c1, the dense (C, H, W, N) buffer of dense_len bytes and the
 * code buffer of code_len bytes; 0, or -1 with an exception naming the function fn */
static int parse_pool(PyObject *dims, PyObject *strides, Pool *p, Py_ssize_t other_len,
                      int it, const char *what, const char *fn, Py_ssize_t c0, Py_ssize_t c1,
                      Py_ssize_t dense_len, Py_ssize_t code_len)
{
    if (!PyArg_ParseTuple(dims, "LLLLLL", &p->C, &p->H, &p->W, &p->N, &p->oh, &p->ow)
        || !PyArg_ParseTuple(strides, "LLLL", &p->sn, &p->sc, &p->si, &p->sj))
        return -1;
    if (p->C < 1 || p->N < 1 || p->oh < 1 || p->ow < 1 || 2 * p->oh > p->H
        || 2 * p->ow > p->W || p->sn < 0 || p->sc < 0 || p->si < 0 || p->sj < 0) {
        PyErr_SetString(PyExc_ValueError, "pool geometry: inconsistent sizes");
        return -1;
    }
    int64_t last = (p->N - 1) * p->sn + (p->C - 1) * p->sc + (p->oh - 1) * p->si
                   + (p->ow - 1) * p->sj;
    if ((last + 1) * it > other_len) {
        PyErr_Format(PyExc_ValueError, "%s: too small for its strides", what);
        return -1;
    }
    if (c0 < 0 || c1 <= c0 || c1 > p->C || dense_len < p->C * p->H * p->W * p->N * it
        || code_len < p->C * p->oh * p->ow * p->N) {
        PyErr_Format(PyExc_ValueError, "%s: buffers or channels do not fit", fn);
        return -1;
    }
    return 0;
}

/* samples per pass over a window row: the output (or its gradient), strided by sample, is
 * then written (read) a few cache lines at a time along the row instead of one line per
 * sample and pixel */
#define NBLOCK 16

/* the winner's position: bottom row if strictly greater, then that row's right column if
 * strictly greater (0/1 values, or all-ones masks negated to 1) */
#define WINNER(ct, cb, ch) (((ch) << 1) | ((ct) ^ ((ch) & ((ct) ^ (cb)))))

static void pool_fwd(const float *x, float *out, uint8_t *code, const Pool *p, int64_t c0,
                     int64_t c1)
{
    /* locals, not p's fields: a store through uint8_t* may alias anything */
    const int64_t N = p->N, H = p->H, W = p->W, oh = p->oh, ow = p->ow, row = W * N;
    const int64_t sn = p->sn, sc = p->sc, si = p->si, sj = p->sj;
    for (int64_t c = c0; c < c1; c++)
        for (int64_t i = 0; i < oh; i++)
            for (int64_t n0 = 0; n0 < N; n0 += NBLOCK)
                for (int64_t j = 0; j < ow; j++) {
                    const float *a = x + ((c * H + 2 * i) * W + 2 * j) * N;
                    const float *b = a + N, *d = a + row, *e = d + N;
                    uint8_t *cd = code + ((c * oh + i) * ow + j) * N;
                    float *o = out + c * sc + i * si + j * sj;
                    const int64_t n1 = n0 + NBLOCK < N ? n0 + NBLOCK : N;
                    int64_t n = n0;
                    for (; n + 4 <= n1; n += 4) {
                        v4f va, vb, vd, ve;
                        memcpy(&va, a + n, 16); memcpy(&vb, b + n, 16);
                        memcpy(&vd, d + n, 16); memcpy(&ve, e + n, 16);
                        v4f top = np_max4(va, vb), bot = np_max4(vd, ve);
                        v4f m = np_max4(top, bot);
                        v4i k = WINNER(-(vb > va), -(ve > vd), -(bot > top));
                        for (int q = 0; q < 4; q++) {
                            o[(n + q) * sn] = m[q];
                            cd[n + q] = (uint8_t)k[q];
                        }
                    }
                    for (; n < n1; n++) {
                        float top = np_max1(a[n], b[n]), bot = np_max1(d[n], e[n]);
                        int ct = b[n] > a[n], cb = e[n] > d[n], ch = bot > top;
                        o[n * sn] = np_max1(top, bot);
                        cd[n] = (uint8_t)WINNER(ct, cb, ch);
                    }
                }
}

#define DEFINE_POOL(T)                                                                        \
    static void pool_bwd_##T(const T *restrict g, const uint8_t *restrict code,              \
                             T *restrict gin, const Pool *p, int64_t c0, int64_t c1)          \
    {                                                                                          \
        const int64_t N = p->N, H = p->H, W = p->W, oh = p->oh, ow = p->ow, row = W * N;     \
        const int64_t sn = p->sn, sc = p->sc, si = p->si, sj = p->sj;                         \
        for (int64_t c = c0; c < c1; c++)                                                      \
            for (int64_t i = 0; i < oh; i++)                                                   \
              for (int64_t n0 = 0; n0 < N; n0 += NBLOCK)                                       \
                for (int64_t j = 0; j < ow; j++) {                                             \
                    T *restrict a = gin + ((c * H + 2 * i) * W + 2 * j) * N;                  \
                    T *restrict b = a + N, *restrict d = a + row, *restrict e = d + N;        \
                    const uint8_t *restrict cd = code + ((c * oh + i) * ow + j) * N;           \
                    const T *restrict gg = g + c * sc + i * si + j * sj;                       \
                    const int64_t n1 = n0 + NBLOCK < N ? n0 + NBLOCK : N;                      \
                    for (int64_t n = n0; n < n1; n++) {                                        \
                        T v = gg[n * sn];                                                      \
                        uint8_t k = cd[n];                                                     \
                        /* a multiply, as NumPy's: a NaN gradient reaches all four */          \
                        a[n] = v * (T)(k == 0); b[n] = v * (T)(k == 1);                        \
                        d[n] = v * (T)(k == 2); e[n] = v * (T)(k == 3);                        \
                    }                                                                          \
                }                                                                              \
    }

DEFINE_POOL(float)
DEFINE_POOL(double)

/* A pooling call's arguments: the forward's input x and output y, or the backward's gradient x
   and input gradient y; the winners' code; the geometry; the channels; the itemsize. */
typedef struct {
    Py_buffer x, y, code;
    PyObject *dims, *strides;
    Py_ssize_t c0, c1;
    int it;
} PoolCall;

/* What both pooling entry points do once their arguments are parsed: check the dtype and the
   geometry (the strided array is the forward's output, the backward's gradient), run the loop
   without the interpreter lock, release the buffers. */
static PyObject *pool_call(PoolCall *q, int bwd, const char *name)
{
    PyObject *result = NULL;
    Pool p;
    Py_buffer *strided = bwd ? &q->x : &q->y, *dense = bwd ? &q->y : &q->x;
    if (q->it != 4 && (!bwd || q->it != 8)) {
        PyErr_Format(PyExc_ValueError, "%s: float32%s only", name, bwd ? " or float64" : "");
        goto done;
    }
    if (parse_pool(q->dims, q->strides, &p, strided->len, q->it, bwd ? "g" : "out", name, q->c0,
                   q->c1, dense->len, q->code.len))
        goto done;
    Py_BEGIN_ALLOW_THREADS
    if (!bwd)
        pool_fwd(q->x.buf, q->y.buf, q->code.buf, &p, q->c0, q->c1);
    else if (q->it == 4)
        pool_bwd_float(q->x.buf, q->code.buf, q->y.buf, &p, q->c0, q->c1);
    else
        pool_bwd_double(q->x.buf, q->code.buf, q->y.buf, &p, q->c0, q->c1);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&q->x); PyBuffer_Release(&q->y); PyBuffer_Release(&q->code);
    return result;
}

/* An entry point: its arguments parsed by fmt into a PoolCall q, then pool_call. */
#define POOL_ENTRY(name, bwd, fmt, ...)                                                        \
    static PyObject *name(PyObject *self, PyObject *args)                                      \
    {                                                                                          \
        PoolCall q;                                                                            \
        if (!PyArg_ParseTuple(args, fmt, __VA_ARGS__))                                         \
            return NULL;                                                                       \
        return pool_call(&q, bwd, #name);                                                      \
    }

static const char maxpool2x2_doc[] =
    "maxpool2x2(x, out, code, dims, out_strides, c0, c1, itemsize)\n\n"
    "Channels c0..c1 of the 2x2/stride-2 max pool of the contiguous (C, H, W, N) float32 x: values into\n"
    "out at the given element strides of its (N, C, oh, ow) indices, winners into the\n"
    "contiguous (C, oh, ow, N) uint8 code. dims: (C, H, W, N, oh, ow).";

POOL_ENTRY(maxpool2x2, 0, "y*w*w*O!O!nni", &q.x, &q.y, &q.code, &PyTuple_Type, &q.dims,
           &PyTuple_Type, &q.strides, &q.c0, &q.c1, &q.it)

static const char maxpool2x2_backward_doc[] =
    "maxpool2x2_backward(g, g_strides, code, gin, dims, c0, c1, itemsize)\n\n"
    "Channels c0..c1 of the input gradient: each window of the contiguous (C, H, W, N) gin gets\n"
    "g (read at the given element strides of its (N, C, oh, ow) indices) at the winner's\n"
    "position and zeros at the other three.";

POOL_ENTRY(maxpool2x2_backward, 1, "y*O!y*w*O!nni", &q.x, &PyTuple_Type, &q.strides, &q.code,
           &q.y, &PyTuple_Type, &q.dims, &q.c0, &q.c1, &q.it)

/* ---- copy_runs: equal contiguous runs from one buffer to another (DTensor redistribution) ---- */

/* Where the caller leaves it to us, the copy bypasses the cache past this many bytes in all:
   the destination would not stay cached anyway, and a plain store first reads each
   destination line it writes. */
#define RUNS_STREAM_BYTES (4 << 20)

#if defined(__SSE2__)
#include <emmintrin.h>
/* One run copied with non-temporal stores to the whole cache lines it covers, memcpy for the
   partial lines at its ends: a neighbouring run writes the rest of those, and a line written
   partly by non-temporal stores goes to memory as a read-modify-write (runs of 1368 bytes
   copied 5-10x slower so than runs of 2048). */
static void run_stream(char *d, const char *s, size_t n)
{
    size_t head = (64 - ((uintptr_t)d & 63)) & 63, body, i;
    if (head > n)
        head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    body = n & ~(size_t)63;
    for (i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    memcpy(d + body, s + body, n - body);
}
#endif

static void runs_loop(char *d, const int64_t *doff, const char *s, const int64_t *soff,
                      Py_ssize_t n, Py_ssize_t run, int stream)
{
    Py_ssize_t r, o;
#if defined(__SSE2__)
    if (stream) {
        for (r = 0; r < n; r++) {
            if (r + 2 < n) /* the hardware's prefetch stops at each run's page: ask ahead */
                for (o = 0; o < run; o += 64)
                    _mm_prefetch(s + soff[r + 2] + o, _MM_HINT_T0);
            run_stream(d + doff[r], s + soff[r], (size_t)run);
        }
        _mm_sfence();
        return;
    }
#endif
    (void)o, (void)stream;
    for (r = 0; r < n; r++)
        memcpy(d + doff[r], s + soff[r], (size_t)run);
}

static const char copy_runs_doc[] =
    "copy_runs(dst, dst_offsets, src, src_offsets, run, stream=-1)\n\n"
    "Copy run bytes from src at each byte offset of src_offsets (int64) to dst at the offset of\n"
    "the same index in dst_offsets, without the interpreter lock. stream: 1, stores that\n"
    "bypass the cache; 0, plain stores; -1, bypass past 4 MiB in all. Every run is checked to\n"
    "lie inside its buffer before any byte moves; the runs must not overlap one another or\n"
    "the other buffer's.";

static PyObject *copy_runs(PyObject *self, PyObject *args)
{
    Py_buffer dst, doff, src, soff;
    Py_ssize_t run, n, r;
    int stream = -1;
    PyObject *result = NULL;
    const int64_t *dv, *sv;
    if (!PyArg_ParseTuple(args, "w*y*y*y*n|i", &dst, &doff, &src, &soff, &run, &stream))
        return NULL;
    n = doff.len / 8;
    dv = doff.buf, sv = soff.buf;
    if (doff.len != soff.len || doff.len % 8 || run < 0) {
        PyErr_SetString(PyExc_ValueError, "copy_runs: the offset arrays must be int64 of one "
                        "length, and run not negative");
        goto done;
    }
    for (r = 0; r < n; r++)
        if (dv[r] < 0 || dv[r] > dst.len - run || sv[r] < 0 || sv[r] > src.len - run) {
            PyErr_Format(PyExc_ValueError, "copy_runs: run %zd (offsets %lld, %lld, %zd bytes) "
                         "leaves its buffer (%zd, %zd bytes)", r, (long long)dv[r],
                         (long long)sv[r], run, dst.len, src.len);
            goto done;
        }
    Py_BEGIN_ALLOW_THREADS
    if (stream < 0)
        stream = (int64_t)n * run >= RUNS_STREAM_BYTES;
    runs_loop(dst.buf, dv, src.buf, sv, n, run, stream);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&dst); PyBuffer_Release(&doff); PyBuffer_Release(&src);
    PyBuffer_Release(&soff);
    return result;
}

/* ---- scatter_runs: one buffer's runs written to several destinations in one pass ---- */

#define SCATTER_MAX 256 /* destinations of one call (a group's ranks on one node) */

/* For each index r, each destination's run in turn; then that destination's next run is
   asked for (one run ahead: two or four ahead were no faster than none). The caller orders
   the destinations by where their runs lie in src: a row's chunks read front to back ran
   1.5-2.2x faster than the same chunks read in another order (64 MiB, 2 and 4 ranks, rows of
   1-16 KiB), where the hardware's own prefetch loses the stream. */
static void scatter_loop(char **d, const int64_t *doff, const char *s, const int64_t *soff,
                         const int64_t *runs, Py_ssize_t k, Py_ssize_t n, int stream)
{
    Py_ssize_t r, j;
    for (r = 0; r < n; r++)
        for (j = 0; j < k; j++) {
            const Py_ssize_t at = j * n + r;
            const size_t len = (size_t)runs[j];
#if defined(__SSE2__)
            if (stream)
                run_stream(d[j] + doff[at], s + soff[at], len);
            else
                memcpy(d[j] + doff[at], s + soff[at], len);
            if (r + 1 < n) {
                const char *next = s + soff[at + 1], *end = next + len;
                for (; next < end; next += 64)
                    _mm_prefetch(next, _MM_HINT_T0);
            }
#else
            (void)stream;
            memcpy(d[j] + doff[at], s + soff[at], len);
#endif
        }
#if defined(__SSE2__)
    if (stream)
        _mm_sfence();
#endif
}

static const char scatter_runs_doc[] =
    "scatter_runs(dsts, dst_offsets, src, src_offsets, runs, stream=-1)\n\n"
    "Copy runs of src to k destination buffers in one pass over src, without the interpreter\n"
    "lock: for each index r < n, for each destination j < k, runs[j] bytes from src at\n"
    "src_offsets[j*n + r] to dsts[j] at dst_offsets[j*n + r] (int64 byte offsets; runs: k\n"
    "int64). Where the runs of one index lie side by side in src (a row's chunks) in the\n"
    "order of the destinations, src is read front to back once. stream as in copy_runs.\n"
    "Every run is checked to lie inside its buffer before any byte moves; runs must not\n"
    "overlap.";

static PyObject *scatter_runs(PyObject *self, PyObject *args)
{
    PyObject *dseq, *result = NULL;
    Py_buffer doff, src, soff, runs, dst[SCATTER_MAX];
    char *dptr[SCATTER_MAX];
    Py_ssize_t k, n, j, r, got = 0;
    const int64_t *dv, *sv, *rv;
    int stream = -1;
    int64_t total = 0;
    if (!PyArg_ParseTuple(args, "Oy*y*y*y*|i", &dseq, &doff, &src, &soff, &runs, &stream))
        return NULL;
    k = PySequence_Check(dseq) ? PySequence_Size(dseq) : -1;
    if (k < 1 || k > SCATTER_MAX || runs.len != 8 * k || doff.len != soff.len
        || doff.len % (8 * k)) {
        PyErr_Format(PyExc_ValueError, "scatter_runs: 1 to %d destinations, runs one int64 "
                     "each, and offsets int64 of one length, a multiple of the destinations",
                     SCATTER_MAX);
        goto done;
    }
    n = doff.len / (8 * k);
    dv = doff.buf, sv = soff.buf, rv = runs.buf;
    for (got = 0; got < k; got++) {
        PyObject *o = PySequence_GetItem(dseq, got);
        int bad = o == NULL || PyObject_GetBuffer(o, &dst[got], PyBUF_WRITABLE) < 0;
        Py_XDECREF(o);
        if (bad)
            goto done;
        dptr[got] = dst[got].buf;
    }
    for (j = 0; j < k; j++) {
        if (rv[j] < 0) {
            PyErr_SetString(PyExc_ValueError, "scatter_runs: a run is negative");
            goto done;
        }
        for (r = 0; r < n; r++) {
            int64_t a = dv[j * n + r], b = sv[j * n + r];
            if (a < 0 || a > dst[j].len - rv[j] || b < 0 || b > src.len - rv[j]) {
                PyErr_Format(PyExc_ValueError, "scatter_runs: run %zd of destination %zd "
                             "(offsets %lld, %lld, %lld bytes) leaves its buffer (%zd, %zd "
                             "bytes)", r, j, (long long)a, (long long)b, (long long)rv[j],
                             dst[j].len, src.len);
                goto done;
            }
        }
        total += rv[j] * (int64_t)n;
    }
    Py_BEGIN_ALLOW_THREADS
    if (stream < 0)
        stream = total >= RUNS_STREAM_BYTES;
    scatter_loop(dptr, dv, src.buf, sv, rv, k, n, stream);
    Py_END_ALLOW_THREADS
    Py_INCREF(Py_None);
    result = Py_None;
done:
    for (j = 0; j < got; j++)
        PyBuffer_Release(&dst[j]);
    PyBuffer_Release(&doff); PyBuffer_Release(&src); PyBuffer_Release(&soff);
    PyBuffer_Release(&runs);
    return result;
}

static PyMethodDef methods[] = {
    {"copy_runs", copy_runs, METH_VARARGS, copy_runs_doc},
    {"scatter_runs", scatter_runs, METH_VARARGS, scatter_runs_doc},
    {"maxpool2x2", maxpool2x2, METH_VARARGS, maxpool2x2_doc},
    {"maxpool2x2_backward", maxpool2x2_backward, METH_VARARGS, maxpool2x2_backward_doc},
    {"forward", forward, METH_VARARGS, forward_doc},
    {"weight_grad", weight_grad, METH_VARARGS, weight_grad_doc},
    {"input_grad", input_grad, METH_VARARGS, input_grad_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpu_kernels",
    "conv2d's banded im2col loops without the interpreter lock (see the file's comment).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cpu_kernels(void)
{
    return PyModule_Create(&module);
}
