/* The codec's element-wise kernels, for the CPU.
 *
 * numpy needs many passes and a full argsort for the exponent-grouped delta
 * (transforms.py); these loops do transform + grouping + byte-plane split (encode) and
 * the inverse (decode) in a few passes that vectorise or stay short (see Grouping), with
 * the GIL released so the codec's thread pool runs them in parallel. They compute exactly
 * what the numpy path computes (tests compare payloads byte for byte); the numpy path
 * stays the reference and the fallback when this module is not built.
 *
 * transform codes: 0 identity, 1 XOR, 2 ULP (zigzag of the difference of value-ordered
 * integers), 3 SUB (zigzag of the integer difference), 4 rotate left one bit (no base). shift < 0: no grouping; else the
 * group key is the base element's bits [shift, bits - 1) (its exponent for floats) and
 * elements are stably sorted by key, as np.argsort(kind="stable") would.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The GIL is let go around a kernel only for inputs of at least RELEASE_GIL_BYTES: a small
 * chunk's kernel (a bias, a norm) takes a few microseconds, and handing the GIL to another
 * thread and waiting to get it back cost several times that (a commit of 3,000 768-byte
 * tensors: each call 4-5x its own time, in futex waits and context switches). */
#define RELEASE_GIL_BYTES (64 * 1024)
#define BEGIN_KERNEL(bytes) { PyThreadState *_save = (bytes) >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
#define END_KERNEL if (_save) PyEval_RestoreThread(_save); }

#define LANES 4 /* quarters walked side by side by the grouped passes (2: as fast; 8, 16: slower) */

/* Grouping by the base's key, done in passes that each vectorise or stay short: the keys
 * (one byte each, two when there are more than 256), their counts, then a scatter (encode)
 * or gather (decode) of already transformed elements. The counting and the scatter walk
 * LANES quarters of the chunk side by side, each quarter with its own counters, so that
 * runs of one key do not serialise on one counter; quarter l's elements of a key go before
 * quarter l+1's, so the order is stable (np.argsort(kind="stable")). */
/* A position in a chunk: 32 bits, since no chunk holds more elements (parse() checks; chunks
 * are at most 256 MiB). Counters of half the width of Py_ssize_t made the counting and the
 * scatter 15-25% faster (more of them stay in registers and L1). */
typedef uint32_t Cursor;
#define MAX_ELEMENTS ((Py_ssize_t)UINT32_MAX)

typedef struct {
    const void *keys;     /* n keys, uint8_t or uint16_t */
    int wide;             /* keys are uint16_t */
    Py_ssize_t nkeys;
    Cursor *next;         /* [LANES][nkeys]: where quarter l's next element with key k goes
                             (allocated twice that: group() counts into both halves) */
} Grouping;

/* Two elements of a quarter a step: both cursors are loaded before either is stored (the
 * second one past the first when the keys are equal), so a run of one key waits on one
 * store-to-load forwarding per pair instead of per element: the gather 1.3-1.4x faster, the
 * scatter 1.15-1.2x, on a bf16 weight's exponents (one step of four, or of one, was slower). */
#define PAIRED_PASS(KT, MOVE)                                                                     \
    const KT *key = (const KT *)g->keys;                                                      \
    const Py_ssize_t q = n / LANES, even = q & ~(Py_ssize_t)1;                                \
    Cursor *nx[LANES];                                                                        \
    for (int l = 0; l < LANES; l++) nx[l] = g->next + l * g->nkeys;                           \
    for (Py_ssize_t i = 0; i < even; i += 2)                                                  \
        for (int l = 0; l < LANES; l++) {                                                     \
            const Py_ssize_t j = i + l * q;                                                   \
            const KT k1 = key[j], k2 = key[j + 1];                                            \
            const Cursor c1 = nx[l][k1], c2 = nx[l][k2] + (k1 == k2);                         \
            nx[l][k1] = c1 + 1;                                                               \
            nx[l][k2] = c2 + 1;                                                               \
            MOVE(c1, j);                                                                      \
            MOVE(c2, j + 1);                                                                  \
        }                                                                                     \
    for (Py_ssize_t i = even; i < q; i++)                                                     \
        for (int l = 0; l < LANES; l++) MOVE(nx[l][key[i + l * q]]++, i + l * q);             \
    for (Py_ssize_t i = LANES * q; i < n; i++) MOVE(nx[LANES - 1][key[i]]++, i);
#define SCATTER_MOVE(c, i) (tmp[(c)] = y[(i)])
#define GATHER_MOVE(c, i) (y[(i)] = tmp[(c)])
#define DEFINE_SCATTER(T, BITS, KT, KBITS)                                                    \
    static void scatter##KBITS##_##BITS(const T *y, const Grouping *g, Py_ssize_t n, T *tmp) {\
        PAIRED_PASS(KT, SCATTER_MOVE)                                                           \
    }                                                                                         \
    static void gather##KBITS##_##BITS(const T *tmp, const Grouping *g, Py_ssize_t n, T *y) { \
        PAIRED_PASS(KT, GATHER_MOVE)                                                            \
    }
#define DEFINE_GROUPING(T, BITS)                                                              \
    DEFINE_SCATTER(T, BITS, uint8_t, 8)                                                       \
    DEFINE_SCATTER(T, BITS, uint16_t, 16)
DEFINE_GROUPING(uint8_t, 8)
DEFINE_GROUPING(uint16_t, 16)
DEFINE_GROUPING(uint32_t, 32)
DEFINE_GROUPING(uint64_t, 64)

/* A payload's planes as it stores them: group after group, each group's planes in order. */
typedef struct {
    const uint8_t *const *ptr; /* groups * width planes */
    const Py_ssize_t *len;     /* elements in each group */
    Py_ssize_t groups;
} Pieces;

/* element i of a group from its byte planes pl[0..BITS/8) (least significant first) */
#define JOIN_AT(BITS, pl, i) join_at_##BITS(pl, i)
static inline uint8_t join_at_8(const uint8_t *const *pl, Py_ssize_t i) { return pl[0][i]; }
static inline uint16_t join_at_16(const uint8_t *const *pl, Py_ssize_t i) {
    return (uint16_t)(pl[0][i] | (uint16_t)pl[1][i] << 8);
}
static inline uint32_t join_at_32(const uint8_t *const *pl, Py_ssize_t i) {
    return pl[0][i] | (uint32_t)pl[1][i] << 8 | (uint32_t)pl[2][i] << 16 | (uint32_t)pl[3][i] << 24;
}
static inline uint64_t join_at_64(const uint8_t *const *pl, Py_ssize_t i) {
    uint64_t v = 0;
    for (int k = 0; k < 8; k++) v |= (uint64_t)pl[k][i] << (8 * k);
    return v;
}

#define SPARSE_FILL_LOOP(T, BITS, CODE)                                                       \
    for (Py_ssize_t i = 0; i < end; i++) {                                                    \
        const T y = forward_##BITS(CODE, load_##BITS(xs, i), load_##BITS(bs, i));             \
        const Py_ssize_t changed = y != 0, gap = i - last - 1;                                \
        small[z] = gap >= 255 ? 255 : (uint8_t)gap;                                           \
        for (int k = 0; k < BITS / 8; k++) values[k * nz + z] = (uint8_t)(y >> (8 * k));      \
        if (changed && gap >= 255) gaps[e++] = (uint32_t)(gap - 255); /* rare: a long run */  \
        z += changed;                                                                         \
        last = changed ? i : last;                                                            \
    }

#define DEFINE_KERNELS(T, BITS)                                                               \
    static inline T ordered_##BITS(T v) {                                                     \
        const T sign = (T)((T)1 << (BITS - 1));                                               \
        return (v & sign) ? (T)(v ^ (T)(sign - 1)) : v;                                       \
    }                                                                                         \
    static inline T zigzag_##BITS(T d) {                                                      \
        return (T)((T)(d << 1) ^ (T)(0 - (T)(d >> (BITS - 1))));                              \
    }                                                                                         \
    static inline T unzigzag_##BITS(T z) { return (T)((T)(z >> 1) ^ (T)(0 - (T)(z & 1))); } \
    static inline T forward_##BITS(int code, T x, T b) {                                      \
        switch (code) {                                                                       \
        case 1: return (T)(x ^ b);                                                            \
        case 2: return zigzag_##BITS((T)(ordered_##BITS(x) - ordered_##BITS(b)));             \
        case 3: return zigzag_##BITS((T)(x - b));                                             \
        case 4: return (T)((T)(x << 1) | (T)(x >> (BITS - 1)));                               \
        default: return x;                                                                    \
        }                                                                                     \
    }                                                                                         \
    static inline T inverse_##BITS(int code, T y, T b) {                                      \
        switch (code) {                                                                       \
        case 1: return (T)(y ^ b);                                                            \
        case 2: return ordered_##BITS((T)(unzigzag_##BITS(y) + ordered_##BITS(b)));           \
        case 3: return (T)(unzigzag_##BITS(y) + b);                                           \
        case 4: return (T)((T)(y >> 1) | (T)((T)(y & 1) << (BITS - 1)));                      \
        default: return y;                                                                    \
        }                                                                                     \
    }                                                                                         \
    static inline T load_##BITS(const uint8_t *p, Py_ssize_t i) {                             \
        T v;                                                                                  \
        memcpy(&v, p + i * (BITS / 8), BITS / 8);                                             \
        return v;                                                                             \
    }                                                                                         \
    /* planes <-> elements: one simple loop per plane, which the compiler vectorises */       \
    static void split_##BITS(const T *y, Py_ssize_t n, uint8_t *out) {                       \
        for (int k = 0; k < BITS / 8; k++) {                                                  \
            uint8_t *plane = out + k * n;                                                     \
            for (Py_ssize_t i = 0; i < n; i++) plane[i] = (uint8_t)(y[i] >> (8 * k));         \
        }                                                                                     \
    }                                                                                         \
    /* the planes of each group (pieces[g * width + k]: plane k of group g) into elements */  \
    static void join_##BITS(const Pieces *p, T *restrict y) {                                \
        for (Py_ssize_t g = 0; g < p->groups; g++) {                                          \
            const Py_ssize_t len = p->len[g];                                                 \
            const uint8_t *pl[BITS / 8];                                                      \
            for (int k = 0; k < BITS / 8; k++) pl[k] = p->ptr[g * (BITS / 8) + k];            \
            for (Py_ssize_t i = 0; i < len; i++) y[i] = JOIN_AT(BITS, pl, i);                 \
            y += len;                                                                         \
        }                                                                                     \
    }                                                                                         \
    /* an ungrouped payload: join the planes and undo the transform in one pass, group by     \
     * group (one pass over memory instead of three: a keyframe's decode) */                  \
    static void join_inverse_##BITS(const Pieces *p, int code, const uint8_t *bs, T *restrict y) { \
        for (Py_ssize_t g = 0; g < p->groups; g++) {                                          \
            const Py_ssize_t len = p->len[g];                                                 \
            const uint8_t *pl[BITS / 8];                                                      \
            for (int k = 0; k < BITS / 8; k++) pl[k] = p->ptr[g * (BITS / 8) + k];            \
            switch (code) {                                                                   \
            case 1: for (Py_ssize_t i = 0; i < len; i++) y[i] = inverse_##BITS(1, JOIN_AT(BITS, pl, i), load_##BITS(bs, i)); break; \
            case 2: for (Py_ssize_t i = 0; i < len; i++) y[i] = inverse_##BITS(2, JOIN_AT(BITS, pl, i), load_##BITS(bs, i)); break; \
            case 3: for (Py_ssize_t i = 0; i < len; i++) y[i] = inverse_##BITS(3, JOIN_AT(BITS, pl, i), load_##BITS(bs, i)); break; \
            case 4: for (Py_ssize_t i = 0; i < len; i++) y[i] = inverse_##BITS(4, JOIN_AT(BITS, pl, i), 0); break; \
            default: for (Py_ssize_t i = 0; i < len; i++) y[i] = JOIN_AT(BITS, pl, i);        \
            }                                                                                 \
            y += len;                                                                         \
            if (bs) bs += len * (BITS / 8);                                                   \
        }                                                                                     \
    }                                                                                         \
    /* the transform over a whole chunk, with the method's branch outside the loop */         \
    static void forward_all_##BITS(int code, const uint8_t *xs, const uint8_t *bs,           \
                                   Py_ssize_t n, T *y) {                                      \
        switch (code) {                                                                       \
        case 1: for (Py_ssize_t i = 0; i < n; i++) y[i] = forward_##BITS(1, load_##BITS(xs, i), load_##BITS(bs, i)); break; \
        case 2: for (Py_ssize_t i = 0; i < n; i++) y[i] = forward_##BITS(2, load_##BITS(xs, i), load_##BITS(bs, i)); break; \
        case 3: for (Py_ssize_t i = 0; i < n; i++) y[i] = forward_##BITS(3, load_##BITS(xs, i), load_##BITS(bs, i)); break; \
        case 4: for (Py_ssize_t i = 0; i < n; i++) y[i] = forward_##BITS(4, load_##BITS(xs, i), 0); break; \
        default: memcpy(y, xs, (size_t)n * (BITS / 8));                                       \
        }                                                                                     \
    }                                                                                         \
    static void inverse_all_##BITS(int code, T *y, const uint8_t *bs, Py_ssize_t n) {        \
        switch (code) {                                                                       \
        case 1: for (Py_ssize_t i = 0; i < n; i++) y[i] = inverse_##BITS(1, y[i], load_##BITS(bs, i)); break; \
        case 2: for (Py_ssize_t i = 0; i < n; i++) y[i] = inverse_##BITS(2, y[i], load_##BITS(bs, i)); break; \
        case 3: for (Py_ssize_t i = 0; i < n; i++) y[i] = inverse_##BITS(3, y[i], load_##BITS(bs, i)); break; \
        case 4: for (Py_ssize_t i = 0; i < n; i++) y[i] = inverse_##BITS(4, y[i], 0); break;  \
        default: break;                                                                       \
        }                                                                                     \
    }                                                                                         \
    /* encode: transform (into out), then sort stably by key into tmp, then split into out */ \
    static void encode_##BITS(const uint8_t *xs, const uint8_t *bs, Py_ssize_t n, int code,  \
                              const Grouping *g, uint8_t *out, void *tmp_) {                  \
        T *tmp = (T *)tmp_;                                                                   \
        if (g) {                                                                              \
            forward_all_##BITS(code, xs, bs, n, (T *)out);                                    \
            if (g->wide) scatter16_##BITS((const T *)out, g, n, tmp);                         \
            else scatter8_##BITS((const T *)out, g, n, tmp);                                  \
        } else {                                                                              \
            forward_all_##BITS(code, xs, bs, n, tmp);                                         \
        }                                                                                     \
        split_##BITS(tmp, n, out);                                                            \
    }                                                                                         \
    /* decode: join the planes into tmp, unsort into out, undo the transform in place */      \
    static void decode_##BITS(const Pieces *p, const uint8_t *bs, Py_ssize_t n, int code,    \
                              const Grouping *g, uint8_t *out, void *tmp_) {                  \
        T *tmp = (T *)tmp_;                                                                   \
        if (g) {                                                                              \
            join_##BITS(p, tmp);                                                              \
            if (g->wide) gather16_##BITS(tmp, g, n, (T *)out);                                \
            else gather8_##BITS(tmp, g, n, (T *)out);                                         \
            inverse_all_##BITS(code, (T *)out, bs, n);                                        \
        } else {                                                                              \
            join_inverse_##BITS(p, code, bs, (T *)out);                                       \
        }                                                                                     \
    }                                                                                         \
    /* SPARSE: count the changed elements (x != base: every inner transform is zero exactly   \
     * there; a loop that vectorises) and find the last one, then write the gap bytes, the    \
     * values' planes and the escaped gaps (into gaps[], at most end / 256 + 1 of them: each  \
     * escape spans 255 unchanged elements). The fill is branch-free on whether an element    \
     * changed (10-90% of them do, unpredictably): it writes every element at the cursor and  \
     * advances it only past changed ones, up to the last changed element, so no write lands  \
     * past the streams' ends; the transform's switch is outside the loop. */                 \
    static void sparse_count_##BITS(const uint8_t *xs, const uint8_t *bs, Py_ssize_t n,      \
                                    Py_ssize_t *nz, Py_ssize_t *end) {                        \
        Py_ssize_t z = 0, last = n - 1;                                                       \
        for (Py_ssize_t i = 0; i < n; i++) z += load_##BITS(xs, i) != load_##BITS(bs, i);    \
        while (last >= 0 && load_##BITS(xs, last) == load_##BITS(bs, last)) last--;          \
        *nz = z;                                                                              \
        *end = last + 1;                                                                      \
    }                                                                                         \
    static Py_ssize_t sparse_fill_##BITS(const uint8_t *xs, const uint8_t *bs, Py_ssize_t end, \
                                         int code, Py_ssize_t nz, uint8_t *restrict small,    \
                                         uint8_t *restrict values, uint32_t *restrict gaps) { \
        Py_ssize_t last = -1, z = 0, e = 0;                                                   \
        switch (code) {                                                                       \
        case 1: SPARSE_FILL_LOOP(T, BITS, 1) break;                                           \
        case 2: SPARSE_FILL_LOOP(T, BITS, 2) break;                                           \
        default: SPARSE_FILL_LOOP(T, BITS, 3) break;                                          \
        }                                                                                     \
        return e;                                                                             \
    }

/* SPARSE decoding: the base, with each listed element replaced by the inverse transform of
 * its value. Unlisted elements have a zero delta, and every inverse maps 0 back to the base
 * element, so this equals inverting a dense delta that is zero off the list. */
#define DEFINE_SPARSE_DECODE(T, BITS)                                                         \
    static int sparse_apply_##BITS(const uint8_t *small, const uint8_t *const *big,          \
                                   const uint8_t *const *values, Py_ssize_t count, int code, \
                                   const uint8_t *bs, Py_ssize_t n, T *y) {                   \
        memcpy(y, bs, (size_t)n * (BITS / 8));                                                \
        Py_ssize_t pos = -1, e = 0;                                                           \
        for (Py_ssize_t z = 0; z < count; z++) {                                              \
            Py_ssize_t gap = small[z];                                                        \
            if (gap == 255) {                                                                 \
                gap += (Py_ssize_t)((uint32_t)big[0][e] | (uint32_t)big[1][e] << 8 |          \
                                    (uint32_t)big[2][e] << 16 | (uint32_t)big[3][e] << 24);   \
                e++;                                                                          \
            }                                                                                 \
            pos += gap + 1;                                                                   \
            if (pos >= n) return -1;                                                          \
            T v = 0;                                                                          \
            for (int k = 0; k < BITS / 8; k++) v |= (T)((T)values[k][z] << (8 * k));          \
            y[pos] = inverse_##BITS(code, v, load_##BITS(bs, pos));                           \
        }                                                                                     \
        return 0;                                                                             \
    }

DEFINE_KERNELS(uint8_t, 8)
DEFINE_KERNELS(uint16_t, 16)
DEFINE_KERNELS(uint32_t, 32)
DEFINE_KERNELS(uint64_t, 64)
DEFINE_SPARSE_DECODE(uint8_t, 8)
DEFINE_SPARSE_DECODE(uint16_t, 16)
DEFINE_SPARSE_DECODE(uint32_t, 32)
DEFINE_SPARSE_DECODE(uint64_t, 64)

/* A grouped delta whose base is a rotated keyframe, from the keyframe's planes (least
 * significant first) instead of the base's elements: join the delta's planes, unsort them
 * by the keys (the caller's, g->keys: the keyframe's top plane), undo the transform against
 * each base element rotated back from its planes. No base buffer is written or read. The
 * last pass names its planes one by one, restrict-qualified: through an array of pointers
 * the compiler cannot rule out that they overlap the output, and its scalar loop branched
 * on every element's sign (1.8x slower than the two decodes it replaces). */
#define ROTATED_BASE_16(i) inverse_16(4, (uint16_t)(p0[i] | (uint16_t)p1[i] << 8), 0)
#define ROTATED_BASE_32(i) inverse_32(4, p0[i] | (uint32_t)p1[i] << 8 | (uint32_t)p2[i] << 16 | (uint32_t)p3[i] << 24, 0)
#define DEFINE_KEYED_DECODE(T, BITS)                                                          \
    __attribute__((noinline)) static void inverse_rotated_##BITS(int code, T *restrict y, const uint8_t *const *pl, \
                                                                 Py_ssize_t n) {                   \
        const uint8_t *restrict p0 = pl[0], *restrict p1 = pl[1];                             \
        const uint8_t *restrict p2 = BITS > 16 ? pl[2] : NULL, *restrict p3 = BITS > 16 ? pl[3] : NULL; \
        (void)p2, (void)p3;                                                                   \
        switch (code) {                                                                       \
        case 1: for (Py_ssize_t i = 0; i < n; i++) y[i] = inverse_##BITS(1, y[i], ROTATED_BASE_##BITS(i)); break; \
        case 2: for (Py_ssize_t i = 0; i < n; i++) y[i] = inverse_##BITS(2, y[i], ROTATED_BASE_##BITS(i)); break; \
        default: for (Py_ssize_t i = 0; i < n; i++) y[i] = inverse_##BITS(3, y[i], ROTATED_BASE_##BITS(i)); break; \
        }                                                                                     \
    }                                                                                         \
    static void decode_keyed_##BITS(const Pieces *p, const uint8_t *const *pl, Py_ssize_t n,   \
                                    int code, const Grouping *g, T *y, T *tmp) {               \
        join_##BITS(p, tmp);                                                                  \
        gather8_##BITS(tmp, g, n, y);                                                         \
        inverse_rotated_##BITS(code, y, pl, n);                                               \
    }
DEFINE_KEYED_DECODE(uint16_t, 16)
DEFINE_KEYED_DECODE(uint32_t, 32)

/* The SPARSE kernels by element width (every caller dispatches the same way). */
static void sparse_count(int width, const uint8_t *xs, const uint8_t *bs, Py_ssize_t n, Py_ssize_t *nz,
                         Py_ssize_t *end) {
    switch (width) {
    case 1: sparse_count_8(xs, bs, n, nz, end); break;
    case 2: sparse_count_16(xs, bs, n, nz, end); break;
    case 4: sparse_count_32(xs, bs, n, nz, end); break;
    default: sparse_count_64(xs, bs, n, nz, end); break;
    }
}

static Py_ssize_t sparse_fill(int width, const uint8_t *xs, const uint8_t *bs, Py_ssize_t end, int code,
                              Py_ssize_t nz, uint8_t *small, uint8_t *values, uint32_t *gaps) {
    switch (width) {
    case 1: return sparse_fill_8(xs, bs, end, code, nz, small, values, gaps);
    case 2: return sparse_fill_16(xs, bs, end, code, nz, small, values, gaps);
    case 4: return sparse_fill_32(xs, bs, end, code, nz, small, values, gaps);
    default: return sparse_fill_64(xs, bs, end, code, nz, small, values, gaps);
    }
}

/* the escaped gaps (gap - 255) as four byte planes, least significant first */
static void gap_planes(const uint32_t *gaps, Py_ssize_t nbig, uint8_t *planes) {
    for (Py_ssize_t e = 0; e < nbig; e++)
        for (int k = 0; k < 4; k++) planes[k * nbig + e] = (uint8_t)(gaps[e] >> (8 * k));
}

static int sparse_apply(int width, const uint8_t *small, const uint8_t *const *big, const uint8_t *const *values,
                        Py_ssize_t count, int code, const uint8_t *bs, Py_ssize_t n, void *y) {
    switch (width) {
    case 1: return sparse_apply_8(small, big, values, count, code, bs, n, (uint8_t *)y);
    case 2: return sparse_apply_16(small, big, values, count, code, bs, n, (uint16_t *)y);
    case 4: return sparse_apply_32(small, big, values, count, code, bs, n, (uint32_t *)y);
    default: return sparse_apply_64(small, big, values, count, code, bs, n, (uint64_t *)y);
    }
}

/* The grouping key of every base element (its bits [shift, bits - 1): the exponent for
 * floats), then counts[k] (elements with key k, for the stream table) and the per-quarter
 * start positions g->next. */
static void count_keys(Grouping *g, Py_ssize_t n, Py_ssize_t *counts);

static void group(const uint8_t *bs, Py_ssize_t n, int width, int shift, Grouping *g, void *keys,
                  Py_ssize_t *counts) {
    const uint64_t mask = (uint64_t)g->nkeys - 1;
/* shifts in the element's own width, so that the loop vectorises with narrow lanes */
#define KEYS(BITS, T, KT)                                                                     \
    for (Py_ssize_t i = 0; i < n; i++) ((KT *)keys)[i] = (KT)((T)(load_##BITS(bs, i) >> shift) & (T)mask);
#define BY_WIDTH(KT)                                                                          \
    switch (width) {                                                                          \
    case 1: KEYS(8, uint8_t, KT) break;                                                       \
    case 2: KEYS(16, uint16_t, KT) break;                                                     \
    case 4: KEYS(32, uint32_t, KT) break;                                                     \
    default: KEYS(64, uint64_t, KT) break;                                                    \
    }
    if (g->wide) { BY_WIDTH(uint16_t) } else { BY_WIDTH(uint8_t) }
#undef BY_WIDTH
#undef KEYS
    g->keys = keys;
    count_keys(g, n, counts);
}

/* counts[k] and the per-quarter start positions g->next from the keys g->keys */
static void count_keys(Grouping *g, Py_ssize_t n, Py_ssize_t *counts) {
    const Py_ssize_t nkeys = g->nkeys, q = n / LANES;
    const void *keys = g->keys;
    /* Two tables per quarter, for even and odd elements: a run of one key then alternates
     * between two counters instead of waiting on one (g->next has room for 2 * LANES). */
    Cursor *c[2 * LANES];
    for (int t = 0; t < 2 * LANES; t++) c[t] = g->next + t * nkeys;
    memset(g->next, 0, sizeof(Cursor) * 2 * LANES * nkeys);
#define COUNT(KT)                                                                             \
    {                                                                                         \
        const KT *k = (const KT *)keys;                                                       \
        const Py_ssize_t even = q & ~(Py_ssize_t)1;                                           \
        for (Py_ssize_t i = 0; i < even; i += 2)                                              \
            for (int l = 0; l < LANES; l++) {                                                 \
                c[l][k[i + l * q]]++;                                                         \
                c[LANES + l][k[i + 1 + l * q]]++;                                             \
            }                                                                                 \
        for (Py_ssize_t i = even; i < q; i++)                                                 \
            for (int l = 0; l < LANES; l++) c[l][k[i + l * q]]++;                             \
        for (Py_ssize_t i = LANES * q; i < n; i++) c[LANES - 1][k[i]]++;                      \
    }
    if (g->wide) COUNT(uint16_t) else COUNT(uint8_t)
#undef COUNT
    for (Py_ssize_t i = 0; i < LANES * nkeys; i++) g->next[i] += g->next[LANES * nkeys + i];
    /* per-quarter counts -> per-quarter start positions: keys in order, quarters in order */
    Py_ssize_t run = 0;
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        counts[k] = 0;
        for (int l = 0; l < LANES; l++) {
            const Py_ssize_t c = g->next[l * nkeys + k];
            g->next[l * nkeys + k] = (Cursor)run;
            run += c;
            counts[k] += c;
        }
    }
}

typedef struct {
    Py_buffer data, base;
    int has_base, width, code, shift;
    Py_ssize_t n, nkeys;
} Args;

static int parse(PyObject *args, Args *a, const char *what) {
    PyObject *data, *base;
    if (!PyArg_ParseTuple(args, "OOiii", &data, &base, &a->width, &a->code, &a->shift)) return -1;
    if (a->width != 1 && a->width != 2 && a->width != 4 && a->width != 8) {
        PyErr_SetString(PyExc_ValueError, "width must be 1, 2, 4 or 8");
        return -1;
    }
    if (a->code < 0 || a->code > 4) {
        PyErr_SetString(PyExc_ValueError, "unknown transform");
        return -1;
    }
    if (PyObject_GetBuffer(data, &a->data, PyBUF_SIMPLE) < 0) return -1;
    a->has_base = base != Py_None;
    if (a->has_base && PyObject_GetBuffer(base, &a->base, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&a->data);
        return -1;
    }
    a->n = a->data.len / a->width;
    const int bits = a->width * 8;
    if (a->n > MAX_ELEMENTS) {
        PyErr_Format(PyExc_ValueError, "%s: chunk too large", what);
        PyBuffer_Release(&a->data);
        if (a->has_base) PyBuffer_Release(&a->base);
        return -1;
    }
    if (a->data.len % a->width || (a->has_base && a->base.len != a->data.len) ||
        ((a->code % 4 != 0 || a->shift >= 0) && !a->has_base) || (a->code == 4 && a->shift >= 0) ||
        a->shift >= bits - 1 ||
        (a->shift >= 0 && bits - 1 - a->shift > 16)) {
        PyErr_Format(PyExc_ValueError, "%s: inconsistent sizes or parameters", what);
        PyBuffer_Release(&a->data);
        if (a->has_base) PyBuffer_Release(&a->base);
        return -1;
    }
    a->nkeys = a->shift >= 0 ? ((Py_ssize_t)1 << (bits - 1 - a->shift)) : 0;
    return 0;
}

static void release(Args *a) {
    PyBuffer_Release(&a->data);
    if (a->has_base) PyBuffer_Release(&a->base);
}

/* A per-thread scratch buffer, kept between calls: a fresh 4 MiB allocation per chunk costs
 * ~1000 page faults, as much as the kernel itself. Freed when the thread's buffer grows, and
 * with the thread (note_thread): a program that decodes from many short-lived threads must
 * not keep every dead thread's buffers. */
typedef struct {
    void *buf;
    size_t cap;
} Scratch;
static __thread Scratch scratch_elements, scratch_keys, scratch_planes, scratch_zout, scratch_packed, scratch_streams;
static void note_thread(void); /* (below, after the zstd contexts it also frees) */

static void *scratch(Scratch *s, size_t size) {
    note_thread();
    if (size > s->cap) {
        free(s->buf);
        s->buf = malloc(size); /* malloc: aligned for any element type */
        s->cap = s->buf ? size : 0;
    }
    return s->buf;
}

typedef void (*kernel_fn)(const uint8_t *, const uint8_t *, Py_ssize_t, int, const Grouping *, uint8_t *,
                          void *);
typedef void (*decode_fn)(const Pieces *, const uint8_t *, Py_ssize_t, int, const Grouping *, uint8_t *, void *);


static PyObject *key_counts(const Py_ssize_t *counts, Py_ssize_t nkeys) {
    if (!nkeys) Py_RETURN_NONE;
    PyObject *sizes = PyList_New(nkeys);
    for (Py_ssize_t k = 0; sizes && k < nkeys; k++) PyList_SET_ITEM(sizes, k, PyLong_FromSsize_t(counts[k]));
    return sizes;
}

static PyObject *encode_planes(PyObject *self, PyObject *args) {
    Args a;
    if (parse(args, &a, "encode") < 0) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, a.data.len);
    Py_ssize_t *counts = NULL;
    Cursor *next = NULL;
    void *tmp = NULL, *keys = NULL;
    Grouping g = {NULL, a.nkeys > 256, a.nkeys, NULL};
    if (out) {
        tmp = scratch(&scratch_elements, a.data.len ? a.data.len : 1);
        if (a.nkeys) {
            counts = malloc(sizeof(Py_ssize_t) * a.nkeys);
            next = malloc(sizeof(Cursor) * 2 * LANES * a.nkeys);
            keys = scratch(&scratch_keys, a.n ? (size_t)a.n * (g.wide ? 2 : 1) : 1);
            g.next = next;
        }
        if (!tmp || (a.nkeys && (!counts || !next || !keys))) {
            Py_CLEAR(out);
            PyErr_NoMemory();
        }
    }
    if (out) {
        static const kernel_fn enc[] = {encode_8, encode_16, NULL, encode_32, NULL, NULL, NULL, encode_64};
        kernel_fn fn = enc[a.width - 1];
        const uint8_t *bs = a.has_base ? (const uint8_t *)a.base.buf : NULL;
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        BEGIN_KERNEL(a.data.len)
        if (a.nkeys) group(bs, a.n, a.width, a.shift, &g, keys, counts);
        fn((const uint8_t *)a.data.buf, bs, a.n, a.code, a.nkeys ? &g : NULL, dst, tmp);
        END_KERNEL
    }
    PyObject *result = NULL;
    if (out) {
        PyObject *sizes = key_counts(counts, a.nkeys);
        result = sizes ? PyTuple_Pack(2, out, sizes) : NULL;
        Py_XDECREF(sizes);
        Py_DECREF(out);
    }
    free(counts);
    free(next);
    release(&a);
    return result;
}

/* decode_planes(streams, base|None, width, transform, shift): streams as the payload stores
 * them (group after group, `width` planes each, all planes of a group the same length), joined
 * straight from the decompressed buffers: no intermediate copy. */
static PyObject *decode_planes(PyObject *self, PyObject *args) {
    PyObject *streams, *base;
    int width, code, shift;
    if (!PyArg_ParseTuple(args, "OOiii", &streams, &base, &width, &code, &shift)) return NULL;
    PyObject *seq = PySequence_Fast(streams, "decode_planes: streams must be a sequence");
    if (!seq) return NULL;
    const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    const int bits = width * 8;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || code < 0 || code > 4 || count < width ||
        count % width || ((code % 4 != 0 || shift >= 0) && base == Py_None) || (code == 4 && shift >= 0) ||
        shift >= bits - 1 ||
        (shift >= 0 && bits - 1 - shift > 16)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "decode: inconsistent sizes or parameters");
        return NULL;
    }
    const Py_ssize_t groups = count / width;
    Py_buffer *views = PyMem_Calloc((size_t)count, sizeof(Py_buffer));
    const uint8_t **ptr = PyMem_Calloc((size_t)count, sizeof(uint8_t *));
    Py_ssize_t *len = PyMem_Calloc((size_t)groups, sizeof(Py_ssize_t));
    Py_buffer bv = {0};
    int has_base = 0;
    Py_ssize_t got = 0, n = 0, nkeys = 0;
    PyObject *out = NULL, *result = NULL;
    Py_ssize_t *counts = NULL;
    Cursor *next = NULL;
    if (!views || !ptr || !len) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < count; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0) goto done;
        ptr[got] = views[got].buf;
        const Py_ssize_t g = got / width;
        if (got % width == 0) {
            len[g] = views[got].len;
            n += len[g];
        } else if (views[got].len != len[g]) {
            PyErr_SetString(PyExc_ValueError, "decode: the planes of a group differ in length");
            goto done;
        }
    }
    if (base != Py_None) {
        if (PyObject_GetBuffer(base, &bv, PyBUF_SIMPLE) < 0) goto done;
        has_base = 1;
        if (bv.len != n * width) {
            PyErr_SetString(PyExc_ValueError, "decode: the planes do not add up to the base's size");
            goto done;
        }
    }
    nkeys = shift >= 0 ? ((Py_ssize_t)1 << (bits - 1 - shift)) : 0;
    Grouping g = {NULL, nkeys > 256, nkeys, NULL};
    void *tmp = scratch(&scratch_elements, n ? (size_t)(n * width) : 1), *keys = NULL;
    if (nkeys) {
        counts = malloc(sizeof(Py_ssize_t) * nkeys);
        next = malloc(sizeof(Cursor) * 2 * LANES * nkeys);
        keys = scratch(&scratch_keys, n ? (size_t)n * (g.wide ? 2 : 1) : 1);
        g.next = next;
    }
    out = PyBytes_FromStringAndSize(NULL, n * width);
    if (n > MAX_ELEMENTS) {
        PyErr_SetString(PyExc_ValueError, "decode: chunk too large");
        goto done;
    }
    if (!out || !tmp || (nkeys && (!counts || !next || !keys))) {
        if (out) PyErr_NoMemory();
        goto done;
    }
    static const decode_fn dec[] = {decode_8, decode_16, NULL, decode_32, NULL, NULL, NULL, decode_64};
    const Pieces pieces = {ptr, len, groups};
    const uint8_t *bs = has_base ? (const uint8_t *)bv.buf : NULL;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
    BEGIN_KERNEL(n * width)
    if (nkeys) group(bs, n, width, shift, &g, keys, counts);
    dec[width - 1](&pieces, bs, n, code, nkeys ? &g : NULL, dst, tmp);
    END_KERNEL
    PyObject *sizes = key_counts(counts, nkeys);
    if (sizes) result = PyTuple_Pack(2, out, sizes);
    Py_XDECREF(sizes);
done:
    Py_XDECREF(out);
    free(counts);
    free(next);
    if (has_base) PyBuffer_Release(&bv);
    for (Py_ssize_t k = 0; views && k < got; k++) PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    PyMem_Free((void *)ptr);
    PyMem_Free(len);
    Py_DECREF(seq);
    return result;
}

/* pack_bits(data, bits) -> bytes: values < 2**bits, 8/bits per byte, value k of a byte at bit
 * k*bits; the last byte zero-padded. unpack_bits(packed, bits, n) -> the n values back.
 *
 * Both work on eight values at a time: packing gathers the low bits of eight bytes with
 * multiplications whose partial products never overlap (so no carries), unpacking looks
 * each packed byte up in a table of its 8/bits spread-out values. */
static uint64_t spread_table[3][256]; /* [1 bit, 2 bits, 4 bits][packed byte] -> values */

static void build_spread_tables(void) {
    static const int widths[3] = {1, 2, 4};
    for (int w = 0; w < 3; w++) {
        const int bits = widths[w], per = 8 / bits;
        for (int v = 0; v < 256; v++) {
            uint64_t spread = 0;
            for (int k = 0; k < per; k++)
                spread |= (uint64_t)((v >> (k * bits)) & ((1 << bits) - 1)) << (8 * k);
            spread_table[w][v] = spread;
        }
    }
}

static inline uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* eight values (one per byte of w, already masked) -> 8*bits packed bits */
static inline uint32_t pack8(uint64_t w, int bits) {
    switch (bits) {
    case 1: /* byte k (bit 8k) -> bit 56+k: multiplier sum of 2**(56-7j) */
        return (uint32_t)((w * 0x0102040810204080ULL) >> 56);
    case 2: { /* per 32-bit half: byte k (bits 8k..8k+1) -> bits 24+2k: multiplier sum 2**(24-6j) */
        const uint64_t lo = ((w & 0xFFFFFFFFULL) * 0x01041040ULL) >> 24 & 0xFF;
        const uint64_t hi = ((w >> 32) * 0x01041040ULL) >> 24 & 0xFF;
        return (uint32_t)(lo | hi << 8);
    }
    default: { /* nibbles: fold pairs of bytes, then pairs of 16-bit lanes */
        w = (w | (w >> 4)) & 0x00FF00FF00FF00FFULL;
        w = (w | (w >> 8)) & 0x0000FFFF0000FFFFULL;
        return (uint32_t)(w | (w >> 16));
    }
    }
}

/* values < 2**bits from src[0..n) into dst[0..ceil(n * bits / 8)); no GIL needed */
static void pack_into(const uint8_t *src, Py_ssize_t n, int bits, uint8_t *dst) {
    const int per = 8 / bits;
    const uint8_t mask = (uint8_t)((1 << bits) - 1);
    const uint64_t lanes = 0x0101010101010101ULL * mask;
    const Py_ssize_t words = n / 8; /* eight values give `bits` output bytes */
    /* one loop per width, so that pack8's switch and the store size are constants */
#define PACK_LOOP(B)                                                                      \
    for (Py_ssize_t j = 0; j < words; j++) {                                              \
        const uint32_t v = pack8(load64(src + 8 * j) & lanes, B);                         \
        memcpy(dst + j * B, &v, B); /* little-endian: the low bytes */                    \
    }
    if (bits == 1) PACK_LOOP(1) else if (bits == 2) PACK_LOOP(2) else PACK_LOOP(4)
#undef PACK_LOOP
    for (Py_ssize_t i = words * 8; i < n; i += per) { /* the tail, a byte at a time */
        uint8_t v = 0;
        for (int k = 0; k < per && i + k < n; k++) v |= (uint8_t)((src[i + k] & mask) << (k * bits));
        dst[i / per] = v;
    }
}

static PyObject *pack_bits(PyObject *self, PyObject *args) {
    Py_buffer in;
    int bits;
    if (!PyArg_ParseTuple(args, "y*i", &in, &bits)) return NULL;
    if (bits != 1 && bits != 2 && bits != 4) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_ValueError, "bits must be 1, 2 or 4");
        return NULL;
    }
    const int per = 8 / bits;
    const Py_ssize_t n = in.len, m = (n + per - 1) / per;
    PyObject *out = PyBytes_FromStringAndSize(NULL, m);
    if (out) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        BEGIN_KERNEL(n)
        pack_into(in.buf, n, bits, dst);
        END_KERNEL
    }
    PyBuffer_Release(&in);
    return out;
}

/* n values of `bits` bits from src (at least ceil(n * bits / 8) bytes) into dst; no GIL */
static void unpack_into(const uint8_t *restrict src, int bits, Py_ssize_t n, uint8_t *restrict dst) {
    const int per = 8 / bits;
    const uint64_t *table = spread_table[bits == 1 ? 0 : bits == 2 ? 1 : 2];
    const Py_ssize_t whole = n / per; /* packed bytes whose values all fit */
#define UNPACK_LOOP(PER) \
    for (Py_ssize_t j = 0; j < whole; j++) memcpy(dst + j * PER, &table[src[j]], PER);
    if (per == 8) {
        UNPACK_LOOP(8)
    } else if (per == 4) {
        UNPACK_LOOP(4)
    } else { /* two nibbles: a loop that vectorises, 4x the table's speed (1 and 2 bits: slower) */
        for (Py_ssize_t j = 0; j < whole; j++) {
            const uint8_t v = src[j];
            dst[2 * j] = v & 15;
            dst[2 * j + 1] = v >> 4;
        }
    }
#undef UNPACK_LOOP
    if (whole * per < n) {
        const uint64_t last = table[src[whole]];
        memcpy(dst + whole * per, &last, (size_t)(n - whole * per));
    }
}

static PyObject *unpack_bits(PyObject *self, PyObject *args) {
    Py_buffer in;
    int bits;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*in", &in, &bits, &n)) return NULL;
    const int per = (bits == 1 || bits == 2 || bits == 4) ? 8 / bits : 0;
    if (!per || n < 0 || (n + per - 1) / per > in.len) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_ValueError, "unpack_bits: bad bit width or too few bytes");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out) {
        uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);
        BEGIN_KERNEL(n)
        unpack_into(in.buf, bits, n, dst);
        END_KERNEL
    }
    PyBuffer_Release(&in);
    return out;
}

/* sparse_encode(x, base, width, transform) -> (gap bytes, escaped gaps as 4 planes, value planes)
 * exactly as transforms._gap_streams and the planes of the nonzero deltas. */
static PyObject *sparse_encode(PyObject *self, PyObject *args) {
    Args a;
    if (parse(args, &a, "sparse_encode") < 0) return NULL;
    if (!a.has_base || a.shift >= 0 || a.code == 4) {
        release(&a);
        PyErr_SetString(PyExc_ValueError, "sparse_encode needs a base, a delta transform and no grouping");
        return NULL;
    }
    const uint8_t *xs = a.data.buf, *bs = a.base.buf;
    Py_ssize_t nz = 0, nbig = 0, end = 0;
    BEGIN_KERNEL(a.data.len)
    sparse_count(a.width, xs, bs, a.n, &nz, &end);
    END_KERNEL
    PyObject *small = PyBytes_FromStringAndSize(NULL, nz);
    PyObject *values = PyBytes_FromStringAndSize(NULL, nz * a.width);
    PyObject *big = NULL, *result = NULL;
    uint32_t *gaps = malloc(sizeof(uint32_t) * (size_t)(end / 256 + 1));
    if (small && values && gaps) {
        uint8_t *sp = (uint8_t *)PyBytes_AS_STRING(small), *vp = (uint8_t *)PyBytes_AS_STRING(values);
        BEGIN_KERNEL(a.data.len)
        nbig = sparse_fill(a.width, xs, bs, end, a.code, nz, sp, vp, gaps);
        END_KERNEL
        big = PyBytes_FromStringAndSize(NULL, 4 * nbig);
        if (big) {
            gap_planes(gaps, nbig, (uint8_t *)PyBytes_AS_STRING(big));
            result = PyTuple_Pack(3, small, big, values);
        }
    } else if (!gaps) {
        PyErr_NoMemory();
    }
    free(gaps);
    Py_XDECREF(small);
    Py_XDECREF(big);
    Py_XDECREF(values);
    release(&a);
    return result;
}

/* changed_count(x, base, width) -> how many elements differ from the base's (the method
 * trials' cheap look at a sample: SPARSE is not tried on a mostly changed chunk). */
static PyObject *changed_count(PyObject *self, PyObject *args) {
    Py_buffer x, b;
    int width;
    if (!PyArg_ParseTuple(args, "y*y*i", &x, &b, &width)) return NULL;
    Py_ssize_t nz = 0, end = 0;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || x.len != b.len || x.len % width) {
        PyBuffer_Release(&x);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "changed_count: sizes or width do not match");
        return NULL;
    }
    const Py_ssize_t n = x.len / width;
    BEGIN_KERNEL(x.len)
    sparse_count(width, x.buf, b.buf, n, &nz, &end);
    END_KERNEL
    PyBuffer_Release(&x);
    PyBuffer_Release(&b);
    return PyLong_FromSsize_t(nz);
}


/* change_stats(a, b, kind) -> (changed, sum of a^2, sum of (b-a)^2, max |b-a|, max ULPs):
 * what `wvc diff` reports of one chunk of floats (kind 0 F32, 1 F64, 2 F16, 3 BF16), in one
 * pass. changed counts differing bit patterns; a^2 skips NaNs (an infinity counts); a delta
 * that is not finite counts as 0 (ops/diff.py's torch path is the reference); ULPs are the
 * distance between the sign-magnitude values as ordered integers (-0.0 and 0.0: 0 apart). */
static double half_to_double(uint16_t h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp((double)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp((double)(m | 0x400), e - 25);
    return (h & 0x8000) ? -v : v;
}

static inline int64_t ordered_bits(uint64_t bits, int width) {
    const uint64_t sign = (uint64_t)1 << (8 * width - 1);
    const int64_t magnitude = (int64_t)(bits & (sign - 1));
    return (bits & sign) ? -magnitude : magnitude;
}

static inline double value_of(const uint8_t *p, Py_ssize_t i, int kind, uint64_t *bits) {
    switch (kind) {
    case 0: { uint32_t u; memcpy(&u, p + 4 * i, 4); float f; memcpy(&f, &u, 4); *bits = u; return f; }
    case 1: { uint64_t u; memcpy(&u, p + 8 * i, 8); double d; memcpy(&d, &u, 8); *bits = u; return d; }
    case 2: { uint16_t u; memcpy(&u, p + 2 * i, 2); *bits = u; return half_to_double(u); }
    default: { uint16_t u; memcpy(&u, p + 2 * i, 2); uint32_t w = (uint32_t)u << 16; float f; memcpy(&f, &w, 4);
               *bits = u; return f; }
    }
}

static PyObject *change_stats(PyObject *self, PyObject *args) {
    Py_buffer a, b;
    int kind;
    if (!PyArg_ParseTuple(args, "y*y*i", &a, &b, &kind)) return NULL;
    static const int widths[4] = {4, 8, 2, 2};
    if (kind < 0 || kind > 3 || a.len != b.len || a.len % widths[kind]) {
        PyBuffer_Release(&a);
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "change_stats: sizes or kind do not match");
        return NULL;
    }
    const int width = widths[kind];
    const Py_ssize_t n = a.len / width;
    Py_ssize_t changed = 0;
    double sq_a = 0.0, sq_d = 0.0, max_abs = 0.0;
    int64_t max_ulps = 0;
    BEGIN_KERNEL(a.len)
    /* one loop a kind, the kind's decoding inlined, branch-free, four accumulators of each
     * sum (a chain of dependent additions was the cost); a delta of an unchanged element is
     * 0 (or NaN, which counts as 0, as a delta that is not finite does) */
    double sa[4] = {0, 0, 0, 0}, sd[4] = {0, 0, 0, 0}, ma[4] = {0, 0, 0, 0};
    int64_t mu[4] = {0, 0, 0, 0};
    Py_ssize_t ch[4] = {0, 0, 0, 0};
#define CHANGE_STEP(K, i, l)                                                                    \
    {                                                                                           \
        uint64_t ba, bb;                                                                        \
        const double x = value_of(a.buf, (i), K, &ba), y = value_of(b.buf, (i), K, &bb);       \
        sa[l] += isnan(x) ? 0.0 : x * x;                                                        \
        ch[l] += ba != bb;                                                                      \
        double d = y - x;                                                                       \
        d = isfinite(d) ? d : 0.0;                                                              \
        sd[l] += d * d;                                                                         \
        ma[l] = fabs(d) > ma[l] ? fabs(d) : ma[l];                                              \
        const int64_t oa = ordered_bits(ba, width), ob = ordered_bits(bb, width);               \
        int64_t u;                                                                              \
        if (width == 8 && (oa < 0) != (ob < 0)) { /* across zero at 64 bits: may not fit */    \
            const uint64_t sum = (uint64_t)(oa < 0 ? -oa : oa) + (uint64_t)(ob < 0 ? -ob : ob); \
            u = sum > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)sum;                           \
        } else {                                                                                \
            u = ob > oa ? ob - oa : oa - ob;                                                    \
        }                                                                                       \
        mu[l] = u > mu[l] ? u : mu[l];                                                          \
    }
#define CHANGE_LOOP(K)                                                                          \
    {                                                                                           \
        Py_ssize_t i = 0;                                                                       \
        for (; i + 4 <= n; i += 4) {                                                            \
            CHANGE_STEP(K, i, 0) CHANGE_STEP(K, i + 1, 1) CHANGE_STEP(K, i + 2, 2) CHANGE_STEP(K, i + 3, 3) \
        }                                                                                       \
        for (; i < n; i++) CHANGE_STEP(K, i, 0)                                                 \
    }
    switch (kind) {
    case 0: CHANGE_LOOP(0) break;
    case 1: CHANGE_LOOP(1) break;
    case 2: CHANGE_LOOP(2) break;
    default: CHANGE_LOOP(3) break;
    }
#undef CHANGE_LOOP
#undef CHANGE_STEP
    for (int l = 0; l < 4; l++) {
        sq_a += sa[l];
        sq_d += sd[l];
        changed += ch[l];
        max_abs = ma[l] > max_abs ? ma[l] : max_abs;
        max_ulps = mu[l] > max_ulps ? mu[l] : max_ulps;
    }
    END_KERNEL
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return Py_BuildValue("(ndddL)", changed, sq_a, sq_d, max_abs, (long long)max_ulps);
}

/* stream_stats(data, stride, min_top) -> (largest byte, order-0 entropy in bits per byte or
 * None): the entropy is estimated on every stride-th byte when there are at least 64 * stride
 * bytes, and only when the largest byte is at least min_top (below it the caller packs bits
 * and never asks). What container.compress_stream decides a stream's coder from; its numpy
 * twin is container._entropy_bits (the two sums may differ in the last bits of a double). */
/* the largest byte of p[0..n), and when it is at least min_top the order-0 entropy in *bits
 * (else *bits = -1); no GIL needed */
static unsigned byte_stats(const uint8_t *p, Py_ssize_t n, Py_ssize_t stride, unsigned min_top, double *bits) {
    uint8_t m = 0;
    for (Py_ssize_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m; /* vectorises */
    *bits = -1.0;
    if (m >= min_top) {
        /* four tables: a run of one byte value then rotates over four counters instead of
         * waiting on one (store-to-load forwarding) */
        const Py_ssize_t step = n >= 64 * stride ? stride : 1;
        Py_ssize_t c[4][256], total = 0;
        memset(c, 0, sizeof c);
        Py_ssize_t i = 0;
        for (; i + 3 * step < n; i += 4 * step, total += 4) {
            c[0][p[i]]++;
            c[1][p[i + step]]++;
            c[2][p[i + 2 * step]]++;
            c[3][p[i + 3 * step]]++;
        }
        for (; i < n; i += step, total++) c[0][p[i]]++;
        double sum = 0.0;
        for (int k = 0; k < 256; k++) {
            const Py_ssize_t count = c[0][k] + c[1][k] + c[2][k] + c[3][k];
            if (count) {
                const double q = (double)count / (double)total;
                sum -= q * log2(q);
            }
        }
        *bits = sum;
    }
    return m;
}

static PyObject *stream_stats(PyObject *self, PyObject *args) {
    Py_buffer in;
    Py_ssize_t stride;
    unsigned min_top;
    if (!PyArg_ParseTuple(args, "y*nI", &in, &stride, &min_top)) return NULL;
    if (stride < 1) {
        PyBuffer_Release(&in);
        PyErr_SetString(PyExc_ValueError, "stream_stats: stride must be positive");
        return NULL;
    }
    unsigned top;
    double bits;
    BEGIN_KERNEL(in.len)
    top = byte_stats(in.buf, in.len, stride, min_top, &bits);
    END_KERNEL
    PyBuffer_Release(&in);
    if (bits < 0) return Py_BuildValue("IO", top, Py_None);
    return Py_BuildValue("Id", top, bits);
}

/* sparse_decode(streams, base, width, transform) -> bytes: streams as a SPARSE payload stores
 * them (gap bytes, the escaped gaps' 4 planes, the values' `width` planes), each already
 * decompressed; every length and position is checked before it is used (ValueError). */
static PyObject *sparse_decode(PyObject *self, PyObject *args) {
    PyObject *streams, *base;
    int width, code;
    if (!PyArg_ParseTuple(args, "OOii", &streams, &base, &width, &code)) return NULL;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || code < 1 || code > 3) {
        PyErr_SetString(PyExc_ValueError, "sparse_decode: bad width or transform");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(streams, "sparse_decode: streams must be a sequence");
    if (!seq) return NULL;
    const Py_ssize_t count_streams = PySequence_Fast_GET_SIZE(seq);
    Py_buffer views[13], bv = {0};
    Py_ssize_t got = 0;
    PyObject *out = NULL;
    const char *error = NULL;
    if (count_streams != 5 + width) {
        error = "sparse payload has the wrong stream count";
        goto done;
    }
    for (; got < count_streams; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &views[got], PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(base, &bv, PyBUF_SIMPLE) < 0) goto done;
    if (bv.len % width) {
        error = "sparse_decode: base is not whole elements";
        goto done;
    }
    const Py_ssize_t n = bv.len / width, count = views[0].len;
    const uint8_t *small = views[0].buf;
    Py_ssize_t escaped = 0;
    for (Py_ssize_t z = 0; z < count; z++) escaped += small[z] == 255;
    int consistent = count <= n;
    for (int k = 1; k < 5; k++) consistent &= views[k].len == escaped;
    if (!consistent) {
        error = "sparse payload positions are inconsistent";
        goto done;
    }
    for (int k = 0; k < width; k++)
        if (views[5 + k].len != count) {
            error = "sparse payload values are inconsistent";
            goto done;
        }
    out = PyBytes_FromStringAndSize(NULL, bv.len);
    if (!out) goto done;
    const uint8_t *big[4], *values[8];
    for (int k = 0; k < 4; k++) big[k] = views[1 + k].buf;
    for (int k = 0; k < width; k++) values[k] = views[5 + k].buf;
    int rc;
    void *y = PyBytes_AS_STRING(out);
    BEGIN_KERNEL(n * width)
    rc = sparse_apply(width, small, big, values, count, code, bv.buf, n, y);
    END_KERNEL
    if (rc < 0) {
        Py_CLEAR(out);
        error = "sparse payload positions run past the chunk";
    }
done:
    if (error && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, error);
    for (Py_ssize_t k = 0; k < got; k++) PyBuffer_Release(&views[k]);
    if (bv.obj) PyBuffer_Release(&bv);
    Py_DECREF(seq);
    return out;
}

/* ---- Whole payloads in one call ---------------------------------------------------------
 *
 * encode_payload and decode_payload do what transforms._encode_native/_decode_native and
 * container.compress_stream/stream_bytes do stream by stream in Python, in one call that
 * releases the GIL once: transform, grouping, plane split, each stream's coder choice, bit
 * packing, zstd, and the container. A model of many small tensors has tens of streams per
 * chunk, and each Python-level call into zstd or a kernel hands the GIL over twice; on two
 * cores those hand-offs and the convoys they start were a third of a commit's thread time.
 *
 * zstd is python-zstandard's own build of it: codec/native.py finds its functions and
 * hands their addresses to use_zstd once, so these payloads are byte for byte what
 * zstandard.ZstdCompressor writes with the same parameters (tests compare both paths),
 * and no zstd is compiled or linked here. Decompression may then be moved to another build
 * (use_zstd_decoder: the system's libzstd, whose Huffman loops are assembly where that
 * build has none); any conforming decoder yields the same bytes, and every chunk is
 * hash-checked after it anyway. */

typedef struct {
    unsigned (*versionNumber)(void);
    void *(*createCCtx)(void);
    size_t (*cctxSetParameter)(void *, int, int);
    size_t (*compress2)(void *, void *, size_t, const void *, size_t);
    size_t (*compressBound)(size_t);
    unsigned (*isError)(size_t);
    void *(*createDCtx)(void);
    size_t (*decompressDCtx)(void *, void *, size_t, const void *, size_t);
    unsigned long long (*getFrameContentSize)(const void *, size_t);
    size_t (*freeCCtx)(void *);
    size_t (*freeDCtx)(void *);
} ZstdApi;
#define ZSTD_FUNCTIONS 11
#define CONTENTSIZE_UNKNOWN (0ULL - 1)
#define CONTENTSIZE_ERROR (0ULL - 2)
static ZstdApi zstd;
static int have_zstd;

#define DECODER_FUNCTIONS 6
/* decoders[BUNDLED]: use_zstd's library; decoders[SYSTEM]: use_zstd_decoder's (its
 * decompression functions only; none given while its createDCtx is NULL). active_decoder says
 * which one decompresses; each thread keeps a context of each library it has used
 * (zt.dctx), freed by that library. */
enum { BUNDLED = 0, SYSTEM = 1 };
static ZstdApi decoders[2];
static int active_decoder = BUNDLED;
static long system_dctx_made; /* the system decoder's contexts so far: it is only replaced before the first */

static int addresses(PyObject *args, void **p, Py_ssize_t count, const char *what) {
    PyObject *addrs;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &addrs)) return -1;
    if (PyTuple_GET_SIZE(addrs) != count) {
        PyErr_Format(PyExc_ValueError, "%s: wrong number of functions", what);
        return -1;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        p[k] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addrs, k));
        if (!p[k]) {
            if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "%s: a null function", what);
            return -1;
        }
    }
    return 0;
}

/* use_zstd((address, ...)) -> the library's version number (ZSTD_versionNumber) */
static PyObject *use_zstd(PyObject *self, PyObject *args) {
    void *p[ZSTD_FUNCTIONS];
    if (addresses(args, p, ZSTD_FUNCTIONS, "use_zstd") < 0) return NULL;
    /* POSIX (dlsym) guarantees that a function's address survives a round trip through void * */
    ZstdApi api = {(unsigned (*)(void))p[0], (void *(*)(void))p[1], (size_t (*)(void *, int, int))p[2],
                   (size_t (*)(void *, void *, size_t, const void *, size_t))p[3], (size_t (*)(size_t))p[4],
                   (unsigned (*)(size_t))p[5], (void *(*)(void))p[6],
                   (size_t (*)(void *, void *, size_t, const void *, size_t))p[7],
                   (unsigned long long (*)(const void *, size_t))p[8], (size_t (*)(void *))p[9],
                   (size_t (*)(void *))p[10]};
    if (!have_zstd) decoders[BUNDLED] = api;
    zstd = api;
    have_zstd = 1;
    return PyLong_FromUnsignedLong(zstd.versionNumber());
}

/* use_zstd_decoder((ZSTD_versionNumber, ZSTD_isError, ZSTD_createDCtx, ZSTD_decompressDCtx,
 * ZSTD_getFrameContentSize, ZSTD_freeDCtx)) -> that library's version number: decompress with
 * another libzstd from now on. Only after use_zstd, and before any context of an earlier
 * such library exists (a context is freed by the library that made it): False otherwise,
 * nothing changed. */
static PyObject *use_zstd_decoder(PyObject *self, PyObject *args) {
    void *p[DECODER_FUNCTIONS];
    if (addresses(args, p, DECODER_FUNCTIONS, "use_zstd_decoder") < 0) return NULL;
    if (!have_zstd || __atomic_load_n(&system_dctx_made, __ATOMIC_ACQUIRE)) Py_RETURN_FALSE;
    ZstdApi d = {0};
    d.versionNumber = (unsigned (*)(void))p[0];
    d.isError = (unsigned (*)(size_t))p[1];
    d.createDCtx = (void *(*)(void))p[2];
    d.decompressDCtx = (size_t (*)(void *, void *, size_t, const void *, size_t))p[3];
    d.getFrameContentSize = (unsigned long long (*)(const void *, size_t))p[4];
    d.freeDCtx = (size_t (*)(void *))p[5];
    decoders[SYSTEM] = d;
    __atomic_store_n(&active_decoder, SYSTEM, __ATOMIC_RELEASE);
    return PyLong_FromUnsignedLong(d.versionNumber());
}

/* the version number of the libzstd that decompresses now (0 before use_zstd) */
static unsigned long active_version(void) {
    return have_zstd ? decoders[__atomic_load_n(&active_decoder, __ATOMIC_ACQUIRE)].versionNumber() : 0;
}

/* decode_with_bundled(on) -> the version number of the libzstd that now decompresses: on,
 * python-zstandard's own; off, use_zstd_decoder's again (where one was given). For a chunk
 * that fails its hash check after the system's decoder: decoded again with the bundled one
 * (store.chains.decode_verified), the library is to blame only if the bytes are then right. */
static PyObject *decode_with_bundled(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p", &on)) return NULL;
    __atomic_store_n(&active_decoder, on || !decoders[SYSTEM].createDCtx ? BUNDLED : SYSTEM, __ATOMIC_RELEASE);
    return PyLong_FromUnsignedLong(active_version());
}

/* decoder_version() -> the version number of the libzstd that decompresses (0 before use_zstd) */
static PyObject *decoder_version(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLong(active_version()); }

/* one compression and one decompression context per thread, kept between calls and freed
 * when the thread exits (note_thread) */
#define MAX_ZSTD_PARAMS 32
typedef struct {
    void *cctx, *dctx[2]; /* [BUNDLED], [SYSTEM] */
    int config[2 * MAX_ZSTD_PARAMS];
    Py_ssize_t nconfig; /* ints in config; -1: the context's parameters are unknown */
} ZstdThread;
static __thread ZstdThread zt = {NULL, {NULL, NULL}, {0}, -1};

/* Every thread that takes a buffer or a context is noted once; a pthread key's destructor then
 * frees them when the thread exits. live_threads counts the noted threads still running. */
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static int thread_key_made;
static long live_threads;
static __thread int thread_noted;

static void release_thread(void *unused) {
    Scratch *all[] = {&scratch_elements, &scratch_keys, &scratch_planes, &scratch_zout, &scratch_packed,
                      &scratch_streams};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        free(all[k]->buf);
        all[k]->buf = NULL;
        all[k]->cap = 0;
    }
    if (zt.cctx) zstd.freeCCtx(zt.cctx);
    for (int d = 0; d < 2; d++)
        if (zt.dctx[d]) decoders[d].freeDCtx(zt.dctx[d]);
    zt.cctx = zt.dctx[BUNDLED] = zt.dctx[SYSTEM] = NULL;
    zt.nconfig = -1;
    __atomic_sub_fetch(&live_threads, 1, __ATOMIC_RELAXED);
}

static void make_thread_key(void) { thread_key_made = pthread_key_create(&thread_key, release_thread) == 0; }

static void note_thread(void) {
    if (thread_noted) return;
    thread_noted = 1;
    pthread_once(&thread_key_once, make_thread_key);
    if (thread_key_made && pthread_setspecific(thread_key, &thread_noted) == 0)
        __atomic_add_fetch(&live_threads, 1, __ATOMIC_RELAXED);
}

/* live_thread_states() -> how many running threads hold kernel buffers or zstd contexts */
static PyObject *live_thread_states(PyObject *self, PyObject *unused) {
    return PyLong_FromLong(__atomic_load_n(&live_threads, __ATOMIC_RELAXED));
}

/* set (parameter, value) pairs on this thread's context unless they are already set */
static int zstd_configure(const int *config, Py_ssize_t n) {
    note_thread();
    if (!zt.cctx && !(zt.cctx = zstd.createCCtx())) return -1;
    if (n == zt.nconfig && !memcmp(config, zt.config, sizeof(int) * (size_t)n)) return 0;
    zt.nconfig = -1;
    for (Py_ssize_t i = 0; i + 1 < n; i += 2)
        if (zstd.isError(zstd.cctxSetParameter(zt.cctx, config[i], config[i + 1]))) return -1;
    memcpy(zt.config, config, sizeof(int) * (size_t)n);
    zt.nconfig = n;
    return 0;
}

typedef struct {
    const uint8_t *data;
    Py_ssize_t raw, len;
    uint8_t coder;
} Stream;

typedef struct { /* container.compress_stream's rules */
    Py_ssize_t stride;     /* ENTROPY_SAMPLE_STRIDE */
    unsigned packed_below; /* PACKED_BELOW */
    double incompressible; /* INCOMPRESSIBLE_BITS */
} Coding;

#define CODER_STORED 0
#define CODER_ZSTD 1

/* compress_stream: the smallest of stored, zstd and (small alphabets) bit-packed then zstd.
 * zstd's output goes to *zout, which is advanced; packbuf holds at least n bytes. */
static int code_stream(const uint8_t *p, Py_ssize_t n, const Coding *c, uint8_t **zout, uint8_t *packbuf,
                       Stream *s) {
    s->raw = n;
    s->data = p;
    s->len = n;
    s->coder = CODER_STORED;
    if (n < 64) return 0;
    double bits;
    const unsigned top = byte_stats(p, n, c->stride, c->packed_below, &bits);
    const uint8_t *src = p;
    Py_ssize_t m = n;
    if (top < c->packed_below) {
        const int b = top < 2 ? 1 : top < 4 ? 2 : 4;
        m = (n * b + 7) / 8;
        pack_into(p, n, b, packbuf);
        src = packbuf;
        s->coder = (uint8_t)(b == 1 ? 2 : b == 2 ? 3 : 4);
    } else if (bits > c->incompressible) {
        return 0; /* noise (low mantissa bytes): zstd would store it anyway */
    }
    const size_t z = zstd.compress2(zt.cctx, *zout, zstd.compressBound((size_t)m), src, (size_t)m);
    if (zstd.isError(z)) return -1;
    if (s->coder == CODER_STORED) {
        if ((Py_ssize_t)z >= n - n / 64) return 0; /* saves less than 1/64: stored */
        s->coder = CODER_ZSTD;
    }
    s->data = *zout;
    s->len = (Py_ssize_t)z;
    *zout += z;
    return 0;
}

static inline void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int k = 0; k < bytes; k++) p[k] = (uint8_t)(v >> (8 * k));
}
static inline uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int k = 0; k < bytes; k++) v |= (uint64_t)p[k] << (8 * k);
    return v;
}

#define HEAD_SIZE 16   /* container._HEAD: u8 version, method, width, param; u64 raw size; u32 count */
#define STREAM_SIZE 17 /* container._STREAM: u8 coder; u64 raw length; u64 stored length */
#define CODEC_VERSION 1

/* the container (container.pack) of streams[0..count); NULL with an exception set */
static PyObject *assemble(int method, int width, int param, Py_ssize_t raw_size, const Stream *streams,
                          Py_ssize_t count) {
    Py_ssize_t total = HEAD_SIZE + STREAM_SIZE * count;
    for (Py_ssize_t k = 0; k < count; k++) total += streams[k].len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (!out) return NULL;
    uint8_t *p = (uint8_t *)PyBytes_AS_STRING(out);
    BEGIN_KERNEL(total)
    p[0] = CODEC_VERSION;
    p[1] = (uint8_t)method;
    p[2] = (uint8_t)width;
    p[3] = (uint8_t)param;
    put_le(p + 4, (uint64_t)raw_size, 8);
    put_le(p + 12, (uint64_t)count, 4);
    uint8_t *t = p + HEAD_SIZE, *d = p + HEAD_SIZE + STREAM_SIZE * count;
    for (Py_ssize_t k = 0; k < count; k++, t += STREAM_SIZE) {
        t[0] = streams[k].coder;
        put_le(t + 1, (uint64_t)streams[k].raw, 8);
        put_le(t + 9, (uint64_t)streams[k].len, 8);
        memcpy(d, streams[k].data, (size_t)streams[k].len);
        d += streams[k].len;
    }
    END_KERNEL
    return out;
}

/* transforms.merge_groups: elements per key -> group sizes, small neighbours merged */
static Py_ssize_t merge_groups(const Py_ssize_t *counts, Py_ssize_t nkeys, Py_ssize_t min_group,
                               Py_ssize_t *sizes) {
    Py_ssize_t m = 0, run = 0;
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        run += counts[k];
        if (run >= min_group) {
            sizes[m++] = run;
            run = 0;
        }
    }
    if (run) {
        if (m) sizes[m - 1] += run;
        else sizes[m++] = run;
    }
    return m;
}


/* encode_payload(x, base|None, width, transform, shift, method, param, sparse, min_group,
 *                zstd_params, stride, packed_below, incompressible) -> the payload
 * sparse = 0: the transformed elements' planes, grouped by the base's key when shift >= 0
 * (groups of at least min_group elements); sparse = 1: SPARSE's gap and value streams.
 * zstd_params: native int32 (parameter, value) pairs, as container.zstd_parameters gives. */
static PyObject *encode_payload(PyObject *self, PyObject *args) {
    PyObject *head = PyTuple_GetSlice(args, 0, 5), *data, *base, *result = NULL;
    int width, code, shift, method, param, sparse;
    Py_ssize_t min_group;
    Py_buffer params;
    Coding c;
    if (!head) return NULL;
    if (!PyArg_ParseTuple(args, "OOiiiiiiny*nId", &data, &base, &width, &code, &shift, &method, &param, &sparse,
                          &min_group, &params, &c.stride, &c.packed_below, &c.incompressible)) {
        Py_DECREF(head);
        return NULL;
    }
    Args a;
    const int parsed = parse(head, &a, "encode_payload");
    Py_DECREF(head);
    if (parsed < 0) {
        PyBuffer_Release(&params);
        return NULL;
    }
    const char *error = NULL;
    if (!have_zstd) error = "encode_payload: use_zstd was not called";
    else if (params.len % (2 * sizeof(int)) || params.len > (Py_ssize_t)sizeof(zt.config)) error = "encode_payload: bad zstd parameters";
    else if (c.stride < 1 || min_group < 1) error = "encode_payload: bad coding parameters";
    else if (sparse && (!a.has_base || a.shift >= 0 || a.code == 4 || a.code == 0)) error = "encode_payload: sparse needs a base, a delta transform and no grouping";
    if (error) {
        PyErr_SetString(PyExc_ValueError, error);
        PyBuffer_Release(&params);
        release(&a);
        return NULL;
    }
    const Py_ssize_t n = a.n, nkeys = a.nkeys;
    const uint8_t *xs = a.data.buf, *bs = a.has_base ? a.base.buf : NULL;
    Grouping g = {NULL, nkeys > 256, nkeys, NULL};
    Py_ssize_t *counts = NULL, *sizes = NULL, groups = 0, count = 0;
    Cursor *next = NULL;
    Stream *streams = NULL;
    int failed = 0, nomem = 0;
    /* every allocation happens without the GIL too: malloc does not need it */
    BEGIN_KERNEL(a.data.len)
    if (zstd_configure(params.buf, params.len / (Py_ssize_t)sizeof(int)) < 0) {
        failed = 1;
    } else if (!sparse) {
        uint8_t *planes = scratch(&scratch_planes, a.data.len ? (size_t)a.data.len : 1);
        void *tmp = scratch(&scratch_elements, a.data.len ? (size_t)a.data.len : 1), *keys = NULL;
        sizes = malloc(sizeof(Py_ssize_t) * (size_t)(nkeys ? nkeys : 1));
        if (nkeys) {
            counts = malloc(sizeof(Py_ssize_t) * (size_t)nkeys);
            next = malloc(sizeof(Cursor) * 2 * LANES * (size_t)nkeys);
            keys = scratch(&scratch_keys, n ? (size_t)n * (g.wide ? 2 : 1) : 1);
            g.next = next;
        }
        streams = malloc(sizeof(Stream) * (size_t)width * (size_t)(nkeys ? nkeys : 1));
        if (!planes || !tmp || !sizes || !streams || (nkeys && (!counts || !next || !keys))) {
            nomem = 1;
        } else {
            static const kernel_fn enc[] = {encode_8, encode_16, NULL, encode_32, NULL, NULL, NULL, encode_64};
            if (nkeys) group(bs, n, width, a.shift, &g, keys, counts);
            enc[width - 1](xs, bs, n, code, nkeys ? &g : NULL, planes, tmp);
            if (nkeys) {
                groups = merge_groups(counts, nkeys, min_group, sizes);
            } else {
                groups = 1;
                sizes[0] = n;
            }
            size_t cap = 0;
            Py_ssize_t largest = 0;
            for (Py_ssize_t j = 0; j < groups; j++) {
                cap += (size_t)width * zstd.compressBound((size_t)sizes[j]);
                largest = sizes[j] > largest ? sizes[j] : largest;
            }
            uint8_t *zout = scratch(&scratch_zout, cap ? cap : 1);
            uint8_t *packbuf = scratch(&scratch_packed, largest ? (size_t)largest : 1);
            if (!zout || !packbuf) nomem = 1;
            for (Py_ssize_t j = 0, start = 0; !nomem && !failed && j < groups; start += sizes[j], j++)
                for (int k = 0; k < width && !failed; k++, count++)
                    failed = code_stream(planes + (Py_ssize_t)k * n + start, sizes[j], &c, &zout, packbuf,
                                         &streams[count]) < 0;
        }
    } else {
        Py_ssize_t nz = 0, end = 0, nbig = 0;
        sparse_count(width, xs, bs, n, &nz, &end);
        const size_t gaps_cap = (size_t)(end / 256 + 1);
        /* one buffer: gap bytes, values' planes, escaped gaps as u32, then as 4 planes */
        const size_t span = (size_t)nz * (size_t)(1 + width) + gaps_cap * 8;
        uint8_t *buf = scratch(&scratch_planes, span + 8);
        streams = malloc(sizeof(Stream) * (size_t)(5 + width));
        if (!buf || !streams) {
            nomem = 1;
        } else {
            uint8_t *small = buf, *values = buf + nz, *bigp = values + nz * width;
            uint32_t *gaps = (uint32_t *)scratch(&scratch_keys, gaps_cap * sizeof(uint32_t));
            if (!gaps) nomem = 1;
            else {
                nbig = sparse_fill(width, xs, bs, end, code, nz, small, values, gaps);
                gap_planes(gaps, nbig, bigp);
                const uint8_t *part[13];
                Py_ssize_t plen[13];
                part[0] = small;
                plen[0] = nz;
                for (int k = 0; k < 4; k++) part[1 + k] = bigp + k * nbig, plen[1 + k] = nbig;
                for (int k = 0; k < width; k++) part[5 + k] = values + k * nz, plen[5 + k] = nz;
                size_t cap = 0;
                Py_ssize_t largest = 0;
                for (int k = 0; k < 5 + width; k++) {
                    cap += zstd.compressBound((size_t)plen[k]);
                    largest = plen[k] > largest ? plen[k] : largest;
                }
                uint8_t *zout = scratch(&scratch_zout, cap ? cap : 1);
                uint8_t *packbuf = scratch(&scratch_packed, largest ? (size_t)largest : 1);
                if (!zout || !packbuf) nomem = 1;
                for (int k = 0; !nomem && !failed && k < 5 + width; k++, count++)
                    failed = code_stream(part[k], plen[k], &c, &zout, packbuf, &streams[count]) < 0;
            }
        }
    }
    END_KERNEL
    if (nomem) PyErr_NoMemory();
    else if (failed) PyErr_SetString(PyExc_RuntimeError, "zstd failed to compress a stream");
    else result = assemble(method, width, param, a.data.len, streams, count);
    free(streams);
    free(sizes);
    free(counts);
    free(next);
    PyBuffer_Release(&params);
    release(&a);
    return result;
}

/* the stream table of a payload that container.peek accepted, re-checked here so that
 * nothing below trusts the caller: (coder, raw length, data, stored length) of each */
static const char *read_table(const uint8_t *p, Py_ssize_t len, Stream *streams, Py_ssize_t count) {
    Py_ssize_t offset = HEAD_SIZE + STREAM_SIZE * count;
    if (len < offset) return "payload stream table truncated";
    for (Py_ssize_t k = 0; k < count; k++) {
        const uint8_t *t = p + HEAD_SIZE + STREAM_SIZE * k;
        const uint64_t raw = get_le(t + 1, 8), stored = get_le(t + 9, 8);
        if (t[0] > 4 || raw > (uint64_t)PY_SSIZE_T_MAX || stored > (uint64_t)(len - offset))
            return "payload stream table is inconsistent";
        if (t[0] == CODER_STORED && raw != stored) return "stored stream has the wrong length";
        streams[k].coder = t[0];
        streams[k].raw = (Py_ssize_t)raw;
        streams[k].data = p + offset;
        streams[k].len = (Py_ssize_t)stored;
        offset += (Py_ssize_t)stored;
    }
    if (offset != len) return "payload length does not match its stream table";
    return NULL;
}

/* container._bounded_zstd into dst (exactly `expected` bytes, never more) */
static const char *unzstd(const uint8_t *src, Py_ssize_t len, uint8_t *dst, Py_ssize_t expected) {
    if (len < 4) return "zstd frame declares the wrong size";
    const int which = __atomic_load_n(&active_decoder, __ATOMIC_ACQUIRE);
    const ZstdApi *unz = &decoders[which];
    const unsigned long long declared = unz->getFrameContentSize(src, (size_t)len);
    if (declared == CONTENTSIZE_ERROR) return "zstd frame header is damaged";
    if (declared != CONTENTSIZE_UNKNOWN && declared != (unsigned long long)expected)
        return "zstd frame declares the wrong size";
    if (expected == 0) return NULL;
    note_thread();
    if (!zt.dctx[which]) {
        if (which == SYSTEM) __atomic_add_fetch(&system_dctx_made, 1, __ATOMIC_ACQ_REL);
        if (!(zt.dctx[which] = unz->createDCtx())) return "out of memory for a zstd context";
    }
    const size_t got = unz->decompressDCtx(zt.dctx[which], dst, (size_t)expected, src, (size_t)len);
    if (unz->isError(got)) return "zstd stream is corrupt or decodes to the wrong length";
    if ((Py_ssize_t)got != expected) return "zstd stream decoded to the wrong length";
    return NULL;
}

static const int packed_bits[5] = {0, 0, 1, 2, 4}; /* coder -> bits per value (container.CODER_PACKED) */

/* the scratch that the largest bit-packed stream of streams[0..count) needs, or NULL */
static uint8_t *packed_scratch(const Stream *streams, Py_ssize_t count, int *nomem) {
    Py_ssize_t largest = 0;
    for (Py_ssize_t k = 0; k < count; k++)
        if (packed_bits[streams[k].coder]) {
            const Py_ssize_t inner = (streams[k].raw * packed_bits[streams[k].coder] + 7) / 8;
            largest = inner > largest ? inner : largest;
        }
    uint8_t *packed = largest ? scratch(&scratch_packed, (size_t)largest) : NULL;
    *nomem = largest && !packed;
    return packed;
}

/* container.stream_bytes of one stream into dst (s->raw bytes; a stored stream is read
 * where it lies). s->data then points at its bytes and s->len is its raw length. */
static const char *open_stream(Stream *s, uint8_t *dst, uint8_t *packed) {
    const int bits = packed_bits[s->coder];
    const char *error = NULL;
    if (s->coder == CODER_STORED) {
        return NULL;
    } else if (bits) {
        const Py_ssize_t inner = (s->raw * bits + 7) / 8;
        if (!(error = unzstd(s->data, s->len, packed, inner))) unpack_into(packed, bits, s->raw, dst);
    } else {
        error = unzstd(s->data, s->len, dst, s->raw);
    }
    if (error) return error;
    s->data = dst;
    s->len = s->raw;
    return NULL;
}

/* The sum of the streams' raw lengths into *total; an error when it overflows. */
static const char *stream_total(const Stream *streams, Py_ssize_t count, Py_ssize_t *total) {
    *total = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (streams[k].raw > PY_SSIZE_T_MAX - *total) return "payload stream table is inconsistent";
        *total += streams[k].raw;
    }
    return NULL;
}

/* Each group's planes as the opened streams hold them (ptr[g * width + k], len[g]); an error
 * when the planes of a group differ in length. */
static const char *group_pieces(const Stream *streams, Py_ssize_t groups, int width, const uint8_t **ptr,
                                Py_ssize_t *len) {
    for (Py_ssize_t j = 0; j < groups; j++) {
        len[j] = streams[j * width].len;
        for (int k = 0; k < width; k++) {
            ptr[j * width + k] = streams[j * width + k].data;
            if (streams[j * width + k].len != len[j]) return "stream lengths do not match the chunk's groups";
        }
    }
    return NULL;
}

/* Whether the groups the keys' counts make (merged as the encoder merges them) are the
 * payload's, group for group; an error otherwise. */
static const char *check_groups(const Py_ssize_t *counts, Py_ssize_t nkeys, Py_ssize_t min_group, Py_ssize_t *sizes,
                                const Py_ssize_t *len, Py_ssize_t groups) {
    const Py_ssize_t m = merge_groups(counts, nkeys, min_group, sizes);
    if (m != groups || memcmp(sizes, len, sizeof(Py_ssize_t) * (size_t)m))
        return "stream count does not match the chunk's groups";
    return NULL;
}

/* decode_payload(payload, base|None, width, transform, shift, sparse, min_group) -> the chunk.
 * The payload's header must have been checked by container.peek (method, width, parameter);
 * every length is checked again here before it is used (ValueError). */
static PyObject *decode_payload(PyObject *self, PyObject *args) {
    PyObject *payload_obj, *base;
    int width, code, shift, sparse;
    Py_ssize_t min_group;
    if (!PyArg_ParseTuple(args, "OOiiiin", &payload_obj, &base, &width, &code, &shift, &sparse, &min_group))
        return NULL;
    const int bits = width * 8;
    if ((width != 1 && width != 2 && width != 4 && width != 8) || code < 0 || code > 4 || min_group < 1 ||
        ((code % 4 != 0 || shift >= 0 || sparse) && base == Py_None) || (code == 4 && shift >= 0) ||
        shift >= bits - 1 || (shift >= 0 && bits - 1 - shift > 16) || (sparse && (shift >= 0 || code < 1 || code > 3))) {
        PyErr_SetString(PyExc_ValueError, "decode_payload: inconsistent parameters");
        return NULL;
    }
    if (!have_zstd) {
        PyErr_SetString(PyExc_ValueError, "decode_payload: use_zstd was not called");
        return NULL;
    }
    Py_buffer pv, bv = {0};
    if (PyObject_GetBuffer(payload_obj, &pv, PyBUF_SIMPLE) < 0) return NULL;
    if (base != Py_None && PyObject_GetBuffer(base, &bv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&pv);
        return NULL;
    }
    const uint8_t *p = pv.buf;
    const char *error = NULL;
    PyObject *out = NULL;
    Stream *streams = NULL;
    const uint8_t **ptr = NULL;
    Py_ssize_t *len = NULL, *counts = NULL, *sizes = NULL;
    Cursor *next = NULL;
    Py_ssize_t count = 0, raw_size = 0;
    if (pv.len < HEAD_SIZE) {
        error = "payload shorter than its header";
        goto done;
    }
    raw_size = (Py_ssize_t)get_le(p + 4, 8);
    count = (Py_ssize_t)get_le(p + 12, 4);
    if (p[2] != width || raw_size < 0 || raw_size % width || count > (pv.len - HEAD_SIZE) / STREAM_SIZE ||
        (bv.obj && bv.len != raw_size)) {
        error = "payload does not match the chunk it decodes";
        goto done;
    }
    const Py_ssize_t n = raw_size / width;
    if (n > MAX_ELEMENTS) {
        error = "payload holds too many elements";
        goto done;
    }
    if (sparse ? count != 5 + width : (count % width || count < width)) {
        error = sparse ? "sparse payload has the wrong stream count" : "stream count does not match the element width";
        goto done;
    }
    streams = malloc(sizeof(Stream) * (size_t)(count ? count : 1));
    if (!streams) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    if ((error = read_table(p, pv.len, streams, count)) || (error = stream_total(streams, count, &total))) goto done;
    if (sparse ? total > n * (1 + 4 + width) : total != raw_size) {
        error = "stream lengths do not add up to the chunk";
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, raw_size);
    const Py_ssize_t groups = sparse ? 0 : count / width;
    const Py_ssize_t nkeys = shift >= 0 ? ((Py_ssize_t)1 << (bits - 1 - shift)) : 0;
    Grouping g = {NULL, nkeys > 256, nkeys, NULL};
    void *tmp = NULL, *keys = NULL;
    uint8_t *buf = NULL; /* where the decompressed streams go (they add up to the chunk's size) */
    if (sparse) {
        buf = out ? scratch(&scratch_streams, total ? (size_t)total : 1) : NULL;
    } else {
        ptr = malloc(sizeof(uint8_t *) * (size_t)count);
        len = malloc(sizeof(Py_ssize_t) * (size_t)groups);
        tmp = scratch(&scratch_elements, raw_size ? (size_t)raw_size : 1);
        /* No buffer of their own (one less chunk-sized buffer per thread): a grouped payload's
         * streams go into the output, which the join reads into tmp before the gather writes
         * the output; any other payload's go into tmp, which its one pass reads into the output. */
        buf = nkeys ? (out ? (uint8_t *)PyBytes_AS_STRING(out) : NULL) : (uint8_t *)tmp;
        if (nkeys) {
            counts = malloc(sizeof(Py_ssize_t) * (size_t)nkeys);
            sizes = malloc(sizeof(Py_ssize_t) * (size_t)nkeys);
            next = malloc(sizeof(Cursor) * 2 * LANES * (size_t)nkeys);
            keys = scratch(&scratch_keys, n ? (size_t)n * (g.wide ? 2 : 1) : 1);
            g.next = next;
        }
    }
    if (!out || !buf || (!sparse && (!ptr || !len || !tmp || (nkeys && (!counts || !sizes || !next || !keys))))) {
        if (out) PyErr_NoMemory();
        Py_CLEAR(out);
        goto done;
    }
    uint8_t *y = (uint8_t *)PyBytes_AS_STRING(out);
    const uint8_t *bs = bv.obj ? bv.buf : NULL;
    int nomem = 0;
    uint8_t *packed = packed_scratch(streams, count, &nomem);
    BEGIN_KERNEL(raw_size)
    if (nomem) error = "out of memory";
    for (Py_ssize_t k = 0, cursor = 0; !error && k < count; cursor += streams[k].raw, k++)
        error = open_stream(&streams[k], buf + cursor, packed);
    if (!error && sparse) {
        const uint8_t *small = streams[0].data, *big[4], *values[8];
        const Py_ssize_t nzc = streams[0].len;
        Py_ssize_t escaped = 0;
        for (Py_ssize_t z = 0; z < nzc; z++) escaped += small[z] == 255;
        int consistent = nzc <= n;
        for (int k = 0; k < 4; k++) consistent &= streams[1 + k].len == escaped, big[k] = streams[1 + k].data;
        for (int k = 0; k < width; k++) consistent &= streams[5 + k].len == nzc, values[k] = streams[5 + k].data;
        if (!consistent) error = "sparse payload positions are inconsistent";
        else if (sparse_apply(width, small, big, values, nzc, code, bs, n, y) < 0)
            error = "sparse payload positions run past the chunk";
    } else if (!error && !(error = group_pieces(streams, groups, width, ptr, len))) {
        if (nkeys) {
            group(bs, n, width, shift, &g, keys, counts);
            error = check_groups(counts, nkeys, min_group, sizes, len, groups);
        }
        if (!error) {
            static const decode_fn dec[] = {decode_8, decode_16, NULL, decode_32, NULL, NULL, NULL, decode_64};
            const Pieces pieces = {ptr, len, groups};
            dec[width - 1](&pieces, bs, n, code, nkeys ? &g : NULL, y, tmp);
        }
    }
    END_KERNEL
    if (error) Py_CLEAR(out);
done:
    if (error && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, error);
    free(streams);
    free((void *)ptr);
    free(len);
    free(counts);
    free(sizes);
    free(next);
    if (bv.obj) PyBuffer_Release(&bv);
    PyBuffer_Release(&pv);
    return out;
}

/* decode_on_keyframe(payload, keyframe, width, transform, shift, min_group) -> the chunk.
 * payload: a grouped delta (ULP_EXP, container.peek-checked) of 16- or 32-bit elements keyed
 * by their top 8 bits after a rotation left (shift == bits - 9: bfloat16's and float32's
 * exponent); keyframe: its base, stored whole as rotated planes (PLANES, ROTATED, one group).
 * The rotated base's top plane is then exactly the delta's keys, so the base is never
 * materialised: no keys pass over it, no base written by the keyframe's decode and read back
 * by the delta's (a checkout's most common chain: a fine-tune over the version it started
 * from). The same bytes as decode_payload(payload, decode_payload(keyframe, ...), ...);
 * every length of both payloads is checked before it is used (ValueError). */
static PyObject *decode_on_keyframe(PyObject *self, PyObject *args) {
    PyObject *payload_obj, *keyframe_obj;
    int width, code, shift;
    Py_ssize_t min_group;
    if (!PyArg_ParseTuple(args, "OOiiin", &payload_obj, &keyframe_obj, &width, &code, &shift, &min_group)) return NULL;
    if ((width != 2 && width != 4) || code < 1 || code > 3 || shift != width * 8 - 9 || min_group < 1) {
        PyErr_SetString(PyExc_ValueError, "decode_on_keyframe: inconsistent parameters");
        return NULL;
    }
    if (!have_zstd) {
        PyErr_SetString(PyExc_ValueError, "decode_on_keyframe: use_zstd was not called");
        return NULL;
    }
    Py_buffer pv, kv;
    if (PyObject_GetBuffer(payload_obj, &pv, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(keyframe_obj, &kv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&pv);
        return NULL;
    }
    const uint8_t *p = pv.buf, *kp = kv.buf;
    const char *error = NULL;
    PyObject *out = NULL;
    Stream *streams = NULL, kstreams[4];
    const uint8_t **ptr = NULL;
    Py_ssize_t *len = NULL, *counts = NULL, *sizes = NULL;
    Cursor *next = NULL;
    Py_ssize_t count = 0, raw_size = 0;
    enum { NKEYS = 256 };
    if (pv.len < HEAD_SIZE || kv.len < HEAD_SIZE) {
        error = "payload shorter than its header";
        goto done;
    }
    raw_size = (Py_ssize_t)get_le(p + 4, 8);
    count = (Py_ssize_t)get_le(p + 12, 4);
    if (p[2] != width || raw_size < 0 || raw_size % width || count > (pv.len - HEAD_SIZE) / STREAM_SIZE ||
        count % width || count < width) {
        error = "payload does not match the chunk it decodes";
        goto done;
    }
    if (kp[2] != width || kp[3] != 1 || (Py_ssize_t)get_le(kp + 4, 8) != raw_size || get_le(kp + 12, 4) != (uint64_t)width) {
        error = "keyframe does not match the delta it is the base of";
        goto done;
    }
    const Py_ssize_t n = raw_size / width, groups = count / width;
    if (n > MAX_ELEMENTS) {
        error = "payload holds too many elements";
        goto done;
    }
    if ((error = read_table(kp, kv.len, kstreams, width))) goto done;
    for (int k = 0; k < width; k++)
        if (kstreams[k].raw != n) {
            error = "keyframe stream lengths do not add up to the chunk";
            goto done;
        }
    streams = malloc(sizeof(Stream) * (size_t)count);
    if (!streams) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    if ((error = read_table(p, pv.len, streams, count)) || (error = stream_total(streams, count, &total))) goto done;
    if (total != raw_size) {
        error = "stream lengths do not add up to the chunk";
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, raw_size);
    ptr = malloc(sizeof(uint8_t *) * (size_t)count);
    len = malloc(sizeof(Py_ssize_t) * (size_t)groups);
    counts = malloc(sizeof(Py_ssize_t) * NKEYS);
    sizes = malloc(sizeof(Py_ssize_t) * NKEYS);
    next = malloc(sizeof(Cursor) * 2 * LANES * NKEYS);
    /* the delta's streams go into the output (the join reads them into tmp before the gather
     * writes the output, as in decode_payload); the keyframe's planes into a buffer of their own */
    void *tmp = scratch(&scratch_elements, raw_size ? (size_t)raw_size : 1);
    uint8_t *planes = scratch(&scratch_streams, raw_size ? (size_t)raw_size : 1);
    if (!out || !ptr || !len || !counts || !sizes || !next || !tmp || !planes) {
        if (out) PyErr_NoMemory();
        Py_CLEAR(out);
        goto done;
    }
    uint8_t *y = (uint8_t *)PyBytes_AS_STRING(out);
    int nomem = 0;
    BEGIN_KERNEL(raw_size)
    uint8_t *packed = packed_scratch(kstreams, width, &nomem);
    for (int k = 0; !nomem && !error && k < width; k++) error = open_stream(&kstreams[k], planes + k * n, packed);
    if (!nomem && !error) packed = packed_scratch(streams, count, &nomem);
    for (Py_ssize_t k = 0, cursor = 0; !nomem && !error && k < count; cursor += streams[k].raw, k++)
        error = open_stream(&streams[k], y + cursor, packed);
    if (nomem) error = "out of memory";
    if (!error && !(error = group_pieces(streams, groups, width, ptr, len))) {
        Grouping g = {kstreams[width - 1].data, 0, NKEYS, next};
        count_keys(&g, n, counts);
        if (!(error = check_groups(counts, NKEYS, min_group, sizes, len, groups))) {
            const Pieces pieces = {ptr, len, groups};
            const uint8_t *pl[4];
            for (int k = 0; k < width; k++) pl[k] = kstreams[k].data;
            if (width == 2) decode_keyed_16(&pieces, pl, n, code, &g, (uint16_t *)y, tmp);
            else decode_keyed_32(&pieces, pl, n, code, &g, (uint32_t *)y, tmp);
        }
    }
    END_KERNEL
    if (error) Py_CLEAR(out);
done:
    if (error && !PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, error);
    free(streams);
    free((void *)ptr);
    free(len);
    free(counts);
    free(sizes);
    free(next);
    PyBuffer_Release(&kv);
    PyBuffer_Release(&pv);
    return out;
}

static PyMethodDef methods[] = {
    {"sparse_decode", sparse_decode, METH_VARARGS,
     "sparse_decode(streams, base, width, transform) -> the chunk: base with the listed deltas applied"},
    {"stream_stats", stream_stats, METH_VARARGS,
     "stream_stats(data, stride, min_top) -> (largest byte, order-0 entropy in bits per byte on every\n"
     "stride-th byte, or None when the largest byte is below min_top)"},
    {"sparse_encode", sparse_encode, METH_VARARGS,
     "sparse_encode(x, base, width, transform) -> (gap bytes, escaped gaps (4 planes), value planes)"},
    {"change_stats", change_stats, METH_VARARGS,
     "change_stats(a, b, kind) -> (changed, sum a^2, sum (b-a)^2, max |b-a|, max ULPs) of float chunks"},
    {"changed_count", changed_count, METH_VARARGS,
     "changed_count(x, base, width) -> the number of elements that differ from the base's"},
    {"pack_bits", pack_bits, METH_VARARGS, "pack_bits(values, bits) -> bytes"},
    {"unpack_bits", unpack_bits, METH_VARARGS, "unpack_bits(packed, bits, n) -> bytes"},
    {"encode_planes", encode_planes, METH_VARARGS,
     "encode_planes(x, base|None, width, transform, shift) -> (planes, key counts|None)\n"
     "Transform each element against its base, sort stably by the base's key when shift >= 0,\n"
     "and split into byte planes: plane k is bytes [k*n, (k+1)*n)."},
    {"decode_planes", decode_planes, METH_VARARGS,
     "decode_planes(streams, base|None, width, transform, shift) -> (elements, key counts|None)\n"
     "The inverse of encode_planes; streams: each group's planes, group after group."},
    {"live_thread_states", live_thread_states, METH_NOARGS,
     "live_thread_states() -> how many running threads hold kernel buffers or zstd contexts"},
    {"use_zstd", use_zstd, METH_VARARGS,
     "use_zstd((address, ...)) -> version: the zstd functions encode_payload and decode_payload call"},
    {"use_zstd_decoder", use_zstd_decoder, METH_VARARGS,
     "use_zstd_decoder((address, ...)) -> version or False: decompress with another libzstd"},
    {"decoder_version", decoder_version, METH_NOARGS, "decoder_version() -> the decompressing libzstd's version"},
    {"decode_with_bundled", decode_with_bundled, METH_VARARGS,
     "decode_with_bundled(on) -> the decompressing libzstd's version, python-zstandard's when on"},
    {"encode_payload", encode_payload, METH_VARARGS,
     "encode_payload(x, base|None, width, transform, shift, method, param, sparse, min_group,\n"
     "zstd_params, stride, packed_below, incompressible) -> a whole payload (container.pack's layout)"},
    {"decode_on_keyframe", decode_on_keyframe, METH_VARARGS,
     "decode_on_keyframe(payload, keyframe, width, transform, shift, min_group) -> the chunk: a grouped\n"
     "delta decoded straight from its rotated keyframe's planes (the base never materialised)"},
    {"decode_payload", decode_payload, METH_VARARGS,
     "decode_payload(payload, base|None, width, transform, shift, sparse, min_group) -> the chunk"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    build_spread_tables();
    return PyModule_Create(&module);
}
