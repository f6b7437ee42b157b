/* The step-context coder of ULP_STEP (method 7): a float chunk's ULP deltas against its
 * base, each coded in the context of the same element's previous step (the base's own
 * delta against *its* base) and of the base's exponent. docs/design.md, "ULP_STEP", is
 * the format; codec/step_coder.py is the Python twin, which writes and reads the same bytes.
 *
 * Per element i, with o() the value-ordered integer of a float's bits (ULP's transform):
 *   d = o(x) - o(b)      the delta coded (wrapping at the element's width)
 *   p = o(b) - o(g)      the previous step's delta, which the decoder knows (b and g are its)
 *   context = class(p) * E + exponent(b), class: 0 | +1 | +2..3 | >=+4 | -1 | -2..-3 | <=-4
 * Elements of one context are i.i.d. as far as this model goes, so each context codes its
 * elements as a flag (any changed?), then a list of (zeros before, nonzero delta) pairs and
 * a final run of zeros: the cost is per changed element (and a decision per context), not
 * per element, which is what makes 0.03 bits/element
 * reachable. Runs and values are binarised (exp-Golomb buckets, unary magnitudes) and every
 * binary decision is coded by an adaptive binary range coder (LZMA's carry-less coder) with
 * its own probability per context: two passes over the chunk, neither needing a sort.
 *
 * Decoding walks untrusted bytes: every run is bounded by the elements its context has
 * left, every bucket by the element width, and reading past the end yields zeros and then
 * an error; the result is checked against its id by the caller.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CLASSES 7
#define LANES 4 /* quarters walked side by side: one counter's increments no longer wait on each other */
#define MAX_CONTEXTS (CLASSES << 12) /* exponent fields of at most 12 bits */
#define BUCKETS 40                   /* exp-Golomb buckets: values below 2^40 */
#define MAG_UNARY 16                 /* magnitudes 1..16 unary, larger ones escape */
#ifndef RATE_LIMIT
#define RATE_LIMIT 255 /* a probability adapts like a count up to this many updates */
#endif

/* ---- adaptive binary probabilities ---------------------------------------------------- */
typedef struct {
    uint32_t p; /* P(bit = 0) * 2^32 */
    uint32_t n; /* updates so far, capped at RATE_LIMIT */
} Bit;

static uint32_t recip[RATE_LIMIT + 1]; /* 2^32 / (n + 1.5): the update moves p by 1/(n + 1.5) */

static void build_recip(void) {
    for (uint32_t n = 0; n <= RATE_LIMIT; n++) recip[n] = (uint32_t)((((uint64_t)1) << 33) / (2 * n + 3));
}

static inline uint32_t prob16(const Bit *m) {
    uint32_t p = m->p >> 16;
    return p < 1 ? 1 : (p > 65535 ? 65535 : p);
}

static inline void adapt(Bit *m, int bit) {
    uint64_t r = recip[m->n];
    if (bit) m->p -= (uint32_t)(((uint64_t)m->p * r) >> 32);
    else m->p += (uint32_t)(((uint64_t)(0xFFFFFFFFu - m->p) * r) >> 32);
    if (m->n < RATE_LIMIT) m->n++;
}

typedef struct {
    Bit any; /* whether any of the context's elements changed */
    Bit run_bucket[BUCKETS + 1];
    Bit run_top[BUCKETS + 1][3]; /* the two bits below a run's leading one: a tree of three */
    Bit sign;
    Bit mag[MAG_UNARY];
    Bit mag_bucket[BUCKETS + 1];
    Bit mag_top[BUCKETS + 1][3];
} Model;

static void model_init(Model *m) {
    Bit *b = (Bit *)m;
    for (size_t k = 0; k < sizeof(Model) / sizeof(Bit); k++) b[k].p = 0x80000000u, b[k].n = 0;
}

/* A context starts from where the last coded context of its class (the neighbouring
 * exponent, mostly) left its probabilities, trusted like INHERIT_N updates: neighbouring
 * exponents differ by a factor of two in ULP size, so their statistics are close, and a
 * context with a handful of changed elements no longer pays to learn every probability
 * from one half. */
#ifndef INHERIT_N
#define INHERIT_N 3
#endif
typedef struct {
    Model last[CLASSES];
    int have[CLASSES];
} Inherit;

/* a copy of another context's probabilities, trusted like at most INHERIT_N updates */
static void cap_counts(Bit *b, size_t n) {
    for (size_t k = 0; k < n; k++) if (b[k].n > INHERIT_N) b[k].n = INHERIT_N;
}

static void model_start(Model *m, Inherit *h, int cls) {
    if (!h->have[cls]) { model_init(m); return; }
    *m = h->last[cls];
    cap_counts((Bit *)m, sizeof(Model) / sizeof(Bit));
}

static void model_end(const Model *m, Inherit *h, int cls) {
    h->last[cls] = *m;
    h->have[cls] = 1;
}

/* ---- range coder (LZMA's) ------------------------------------------------------------- */
typedef struct {
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t pending; /* cache bytes not yet written (the cache and 0xFF bytes after it) */
    int started;      /* the first byte LZMA's coder writes is always 0: not written */
    uint8_t *out;
    size_t len, cap;
    int nomem;
} Enc;

static void put_byte(Enc *e, uint8_t v) {
    if (!e->started) { e->started = 1; return; }
    if (e->len == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 4096;
        uint8_t *out = realloc(e->out, cap);
        if (!out) { e->nomem = 1; return; }
        e->out = out, e->cap = cap;
    }
    e->out[e->len++] = v;
}

static void shift_low(Enc *e) {
    if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
        uint8_t carry = (uint8_t)(e->low >> 32), temp = e->cache;
        do {
            put_byte(e, (uint8_t)(temp + carry));
            temp = 0xFF;
        } while (--e->pending != 0);
        e->cache = (uint8_t)((uint32_t)e->low >> 24);
    }
    e->pending++;
    e->low = (uint32_t)e->low << 8;
}

static inline void enc_bit(Enc *e, Bit *m, int bit) {
    uint32_t bound = (e->range >> 16) * prob16(m);
    if (bit) e->low += bound, e->range -= bound;
    else e->range = bound;
    adapt(m, bit);
    while (e->range < (1u << 24)) e->range <<= 8, shift_low(e);
}

static inline void enc_direct(Enc *e, int bit) {
    e->range >>= 1;
    if (bit) e->low += e->range;
    while (e->range < (1u << 24)) e->range <<= 8, shift_low(e);
}

/* the final value: the one in [low, low + range) with the most trailing zero bits, whose
 * zero bytes are then not written (the decoder reads zeros past the end); 0 when out of memory */
static int enc_finish(Enc *e, uint8_t **out, size_t *out_len) {
    for (int m = 32; m >= 0; m--) {
        uint64_t v = (e->low + (1ULL << m) - 1) & ~((1ULL << m) - 1);
        if (v < e->low + e->range) { e->low = v; break; }
    }
    for (int k = 0; k < 5; k++) shift_low(e);
    if (e->nomem) return 0;
    while (e->len && e->out[e->len - 1] == 0) e->len--; /* the decoder reads zeros past the end */
    *out = e->out, *out_len = e->len;
    e->out = NULL;
    return 1;
}

typedef struct {
    const uint8_t *p;
    size_t len, at, over; /* over: bytes read past the end (zeros) */
    uint32_t range, code;
} Dec;

static inline uint8_t next_byte(Dec *d) {
    if (d->at < d->len) return d->p[d->at++];
    d->over++;
    return 0;
}

static void dec_init(Dec *d, const uint8_t *p, size_t len) {
    d->p = p, d->len = len, d->at = 0, d->over = 0, d->range = 0xFFFFFFFFu, d->code = 0;
    for (int k = 0; k < 4; k++) d->code = (d->code << 8) | next_byte(d);
}

static inline int dec_bit(Dec *d, Bit *m) {
    uint32_t bound = (d->range >> 16) * prob16(m);
    int bit;
    if (d->code < bound) d->range = bound, bit = 0;
    else d->code -= bound, d->range -= bound, bit = 1;
    adapt(m, bit);
    while (d->range < (1u << 24)) d->range <<= 8, d->code = (d->code << 8) | next_byte(d);
    return bit;
}

static inline int dec_direct(Dec *d) {
    d->range >>= 1;
    int bit = d->code >= d->range;
    if (bit) d->code -= d->range;
    while (d->range < (1u << 24)) d->range <<= 8, d->code = (d->code << 8) | next_byte(d);
    return bit;
}

/* ---- binarisation --------------------------------------------------------------------- */
/* v >= 1: its bucket j = floor(log2 v) in unary (models bucket[0..j]), then the j bits below
 * the leading one, the first two through the tree top[j], the rest direct. */
static void enc_golomb(Enc *e, Bit *bucket, Bit (*top)[3], uint64_t v) {
    int j = 63 - __builtin_clzll(v);
    for (int t = 0; t < j; t++) enc_bit(e, &bucket[t], 1);
    enc_bit(e, &bucket[j], 0);
    int node = 0;
    for (int t = j - 1; t >= 0; t--) {
        int bit = (int)((v >> t) & 1);
        if (t >= j - 2) {
            enc_bit(e, &top[j][node], bit);
            node = 1 + bit;
        } else enc_direct(e, bit);
    }
}

/* -1 when the bucket would exceed max_bucket */
static int64_t dec_golomb(Dec *d, Bit *bucket, Bit (*top)[3], int max_bucket) {
    int j = 0;
    while (dec_bit(d, &bucket[j])) {
        if (++j > max_bucket) return -1;
    }
    uint64_t v = 1;
    int node = 0;
    for (int t = j - 1; t >= 0; t--) {
        int bit;
        if (t >= j - 2) {
            bit = dec_bit(d, &top[j][node]);
            node = 1 + bit;
        } else bit = dec_direct(d);
        v = (v << 1) | (uint64_t)bit;
    }
    return (int64_t)v;
}

/* a magnitude >= 1: |d| - 1 in unary up to MAG_UNARY (probabilities mag[]), beyond it an
 * escape |d| - MAG_UNARY as an exp-Golomb code (bucket, top); both coders' */
static void enc_magnitude(Enc *e, Bit *mag, Bit *bucket, Bit (*top)[3], uint64_t m) {
    uint64_t u = m - 1;
    for (uint64_t t = 0; t < u && t < MAG_UNARY; t++) enc_bit(e, &mag[t], 1);
    if (u < MAG_UNARY) enc_bit(e, &mag[u], 0);
    else enc_golomb(e, bucket, top, u - MAG_UNARY + 1);
}

/* the magnitude, or 0 when the escape's bucket passes max_bucket */
static inline uint64_t dec_magnitude(Dec *d, Bit *mag, Bit *bucket, Bit (*top)[3], int max_bucket) {
    uint64_t u = 0;
    while (u < MAG_UNARY && dec_bit(d, &mag[u])) u++;
    if (u == MAG_UNARY) {
        int64_t v = dec_golomb(d, bucket, top, max_bucket);
        if (v < 0) return 0;
        u = MAG_UNARY + (uint64_t)v - 1;
    }
    return u + 1;
}

/* a nonzero delta: sign, then its magnitude */
static void enc_value(Enc *e, Model *m, int negative, uint64_t mag) {
    enc_bit(e, &m->sign, negative);
    enc_magnitude(e, m->mag, m->mag_bucket, m->mag_top, mag);
}

/* the magnitude, or 0 when invalid (beyond max_mag) */
static uint64_t dec_value(Dec *d, Model *m, int *negative, uint64_t max_mag, int max_bucket) {
    *negative = dec_bit(d, &m->sign);
    uint64_t mag = dec_magnitude(d, m->mag, m->mag_bucket, m->mag_top, max_bucket);
    return mag > max_mag ? 0 : mag;
}

typedef struct {
    int width, bits, shift;
    uint64_t mask, sign;      /* the element's bits; its sign bit */
    uint64_t emask;           /* the exponent field, after the shift */
    int nexp;                 /* exponent values (E) */
} Layout;

static int layout(Layout *L, int width, int shift) {
    if (width != 1 && width != 2 && width != 4) return 0;
    L->width = width, L->bits = 8 * width, L->shift = shift;
    if (shift < 1 || shift >= L->bits - 1 || L->bits - 1 - shift > 12) return 0;
    L->mask = (1ULL << L->bits) - 1;
    L->sign = 1ULL << (L->bits - 1);
    L->nexp = 1 << (L->bits - 1 - shift);
    L->emask = (uint64_t)L->nexp - 1;
    return 1;
}

/* ---- encode ---------------------------------------------------------------------------- */
typedef struct {
    uint32_t rank; /* the element's index among its context's elements */
    uint32_t ctx;
    uint64_t delta; /* d, masked to the width */
} Event;

typedef struct {
    Event *ev;
    size_t n, cap;
} Events;

static int push(Events *v, Event e) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 1024;
        Event *ev = realloc(v->ev, cap * sizeof(Event));
        if (!ev) return 0;
        v->ev = ev, v->cap = cap;
    }
    v->ev[v->n++] = e;
    return 1;
}

/* The passes over every element, one per width (the per-element work is a few integer
 * operations: a generic load and class cost twice the time). The class: 0 | +1 | +2..3 |
 * >=+4 for p >= 0, 3 more for p < 0, without branches (keys_pass). */
#define ORDERED(T, ST, BITS, v) ((T)((v) ^ ((T)((ST)(v) >> ((BITS) - 1)) >> 1)))
#define DEFINE_PASSES(T, ST, BITS)                                                            \
    /* lane l's changed elements as events: rank within (lane, context), ctx = k * LANES + l */\
    static int events_pass_##BITS(const uint8_t *xs, const uint8_t *bs, const uint16_t *keys, \
                                  Py_ssize_t n, int K, uint32_t *cnt, Events *all) {          \
        const T *x = (const T *)xs, *b = (const T *)bs;                                       \
        const Py_ssize_t q = n / LANES;                                                       \
        for (Py_ssize_t i = 0; i < q; i++)                                                    \
            for (int l = 0; l < LANES; l++) {                                                 \
                Py_ssize_t j = i + l * q;                                                     \
                uint32_t r = cnt[l * K + keys[j]]++;                                          \
                if (x[j] != b[j] && !push(all, (Event){r, (uint32_t)keys[j] * LANES + l,      \
                        (T)(ORDERED(T, ST, BITS, x[j]) - ORDERED(T, ST, BITS, b[j]))}))       \
                    return 0;                                                                 \
            }                                                                                 \
        for (Py_ssize_t j = LANES * q; j < n; j++) {                                          \
            uint32_t r = cnt[(LANES - 1) * K + keys[j]]++;                                    \
            if (x[j] != b[j] && !push(all, (Event){r, (uint32_t)keys[j] * LANES + LANES - 1,  \
                    (T)(ORDERED(T, ST, BITS, x[j]) - ORDERED(T, ST, BITS, b[j]))}))           \
                return 0;                                                                     \
        }                                                                                     \
        return 1;                                                                             \
    }                                                                                         \
    static void keys_pass_##BITS(const uint8_t *bs, const uint8_t *gs, Py_ssize_t n,          \
                                 const Layout *L, uint16_t *keys) {                           \
        const T *b = (const T *)bs, *g = (const T *)gs;                                       \
        const int shift = L->shift, nexp = L->nexp, emask = (int)L->emask;                    \
        for (Py_ssize_t j = 0; j < n; j++) { /* branch-free: it vectorises */                 \
            ST p = (ST)(T)(ORDERED(T, ST, BITS, b[j]) - ORDERED(T, ST, BITS, g[j]));           \
            int neg = p < 0;                                                                  \
            T m = neg ? (T)(0 - (T)p) : (T)p;                                                 \
            int c = (m > 0) + (m > 1) + (m > 3) + neg * 3;                                    \
            keys[j] = (uint16_t)(c * nexp + ((b[j] >> shift) & emask));                       \
        }                                                                                     \
    }                                                                                         \
    /* keys[i] = element i's context; cnt[l * K + k]: lane l's elements of context k */      \
    static void count_pass_##BITS(const uint8_t *bs, const uint8_t *gs, Py_ssize_t n,         \
                                  const Layout *L, uint16_t *keys, uint32_t *cnt, int K) {    \
        keys_pass_##BITS(bs, gs, n, L, keys);                                                 \
        const Py_ssize_t q = n / LANES;                                                       \
        for (Py_ssize_t i = 0; i < q; i++)                                                    \
            for (int l = 0; l < LANES; l++) cnt[l * K + keys[i + l * q]]++;                   \
        for (Py_ssize_t j = LANES * q; j < n; j++) cnt[(LANES - 1) * K + keys[j]]++;          \
    }                                                                                         \
    /* per lane l and context k, s = l * K + k: skip[s] elements of the context to pass before \
     * its next event (UINT32_MAX: none left; a lane has fewer elements), at[s] that event,     \
     * left[s] how many the lane has left. One load and store per element on the common path. */\
    static inline void apply_event_##BITS(const T *b, T *x, Py_ssize_t j, uint32_t s, uint32_t *skip, \
                                          uint32_t *at, uint32_t *left, const Event *ev) {    \
        const Event *e = &ev[at[s]++];                                                        \
        x[j] = ORDERED(T, ST, BITS, (T)(ORDERED(T, ST, BITS, b[j]) + (T)e->delta));           \
        skip[s] = --left[s] ? e[1].rank - e->rank - 1 : UINT32_MAX;                           \
    }                                                                                         \
    static void apply_pass_##BITS(const uint8_t *bs, const uint16_t *keys, Py_ssize_t n,      \
                                  int K, uint32_t *skip, uint32_t *at, uint32_t *left,        \
                                  const Event *ev, uint8_t *xs) {                             \
        const T *b = (const T *)bs;                                                           \
        T *x = (T *)xs;                                                                       \
        const Py_ssize_t q = n / LANES;                                                       \
        for (Py_ssize_t i = 0; i < q; i++)                                                    \
            for (int l = 0; l < LANES; l++) {                                                 \
                Py_ssize_t j = i + l * q;                                                     \
                uint32_t s = (uint32_t)(l * K + keys[j]);                                     \
                if (__builtin_expect(skip[s]-- == 0, 0)) apply_event_##BITS(b, x, j, s, skip, at, left, ev); \
            }                                                                                 \
        for (Py_ssize_t j = LANES * q; j < n; j++) {                                          \
            uint32_t s = (uint32_t)((LANES - 1) * K + keys[j]);                               \
            if (__builtin_expect(skip[s]-- == 0, 0)) apply_event_##BITS(b, x, j, s, skip, at, left, ev); \
        }                                                                                     \
    }
DEFINE_PASSES(uint8_t, int8_t, 8)
DEFINE_PASSES(uint16_t, int16_t, 16)
DEFINE_PASSES(uint32_t, int32_t, 32)

/* 0 on success, else an error message; the coded bytes in *out (malloc'd) */
static const char *encode_step(const uint8_t *x, const uint8_t *b, const uint8_t *g, Py_ssize_t n,
                               const Layout *L, uint8_t **out, size_t *out_len) {
    const int K = CLASSES * L->nexp;
    uint32_t *seen = calloc(K, sizeof(uint32_t));
    uint32_t *cnt = calloc((size_t)LANES * K, sizeof(uint32_t));
    uint32_t *evcount = calloc((size_t)LANES * K + 1, sizeof(uint32_t)); /* per (context, lane) */
    uint16_t *keys = malloc((n ? n : 1) * sizeof(uint16_t));
    Events all = {0}, sorted = {0};
    Model *models = NULL;
    Inherit *inherit = calloc(1, sizeof(Inherit));
    Enc e = {0, 0xFFFFFFFFu, 0, 1, 0, NULL, 0, 0, 0};
    const char *err = "out of memory";
    if (!seen || !cnt || !evcount || !keys || !inherit) goto done;
    int ok;
    if (L->bits == 8) keys_pass_8(b, g, n, L, keys), ok = events_pass_8(x, b, keys, n, K, cnt, &all);
    else if (L->bits == 16) keys_pass_16(b, g, n, L, keys), ok = events_pass_16(x, b, keys, n, K, cnt, &all);
    else keys_pass_32(b, g, n, L, keys), ok = events_pass_32(x, b, keys, n, K, cnt, &all);
    if (!ok) goto done;
    /* a lane's ranks start after the lanes before it; the events grouped by context and, in
     * each, by lane (a stable counting sort on ctx * LANES + lane): element order */
    for (int k = 0; k < K; k++) {
        uint32_t base = 0;
        for (int l = 0; l < LANES; l++) {
            uint32_t c = cnt[l * K + k];
            cnt[l * K + k] = base;
            base += c;
        }
        seen[k] = base;
    }
    for (size_t j = 0; j < all.n; j++) evcount[all.ev[j].ctx + 1]++;
    for (int s = 0; s < LANES * K; s++) evcount[s + 1] += evcount[s];
    sorted.ev = malloc((all.n ? all.n : 1) * sizeof(Event));
    models = malloc(sizeof(Model));
    if (!sorted.ev || !models) goto done;
    for (size_t j = 0; j < all.n; j++) {
        Event ev = all.ev[j];
        uint32_t k = ev.ctx / LANES, l = ev.ctx % LANES;
        ev.rank += cnt[l * K + k];
        sorted.ev[evcount[ev.ctx]++] = ev;
        /* evcount[s] ends at the start of bucket s + 1: context k's events end at evcount[k * LANES + LANES - 1] */
    }
    for (int k = 0; k < K; k++) {
        if (!seen[k]) continue;
        model_start(models, inherit, k / L->nexp);
        uint64_t next = 0; /* the context's first element not yet coded */
        uint32_t from = k ? evcount[k * LANES - 1] : 0, to = evcount[k * LANES + LANES - 1];
        enc_bit(&e, &models->any, to > from);
        if (to == from) next = seen[k];
        for (uint32_t j = from; j < to; j++) {
            const Event *ev = &sorted.ev[j];
            enc_golomb(&e, models->run_bucket, models->run_top, (uint64_t)ev->rank - next + 1);
            int negative = (ev->delta & L->sign) != 0;
            enc_value(&e, models, negative, negative ? (L->mask - ev->delta + 1) & L->mask : ev->delta);
            next = (uint64_t)ev->rank + 1;
        }
        if (next < seen[k]) /* the zeros to the end: a run as long as what is left */
            enc_golomb(&e, models->run_bucket, models->run_top, seen[k] - next + 1);
        model_end(models, inherit, k / L->nexp);
    }
    if (!enc_finish(&e, out, out_len)) goto done;
    err = NULL;
done:
    free(seen), free(cnt), free(evcount), free(keys), free(all.ev), free(sorted.ev), free(models), free(inherit), free(e.out);
    return err;
}

/* ---- decode ---------------------------------------------------------------------------- */
static const char *decode_step(const uint8_t *data, size_t len, const uint8_t *b, const uint8_t *g, Py_ssize_t n,
                               const Layout *L, uint8_t *x) {
    const int K = CLASSES * L->nexp;
    uint32_t *cnt = calloc((size_t)LANES * K, sizeof(uint32_t)); /* per lane, then (below) per lane's rank */
    uint32_t *first = calloc(K + 1, sizeof(uint32_t)); /* context k's events: [first[k], first[k+1]) */
    uint32_t *at = malloc((size_t)LANES * K * sizeof(uint32_t)), *left = calloc((size_t)LANES * K, sizeof(uint32_t));
    uint16_t *keys = malloc((n ? n : 1) * sizeof(uint16_t));
    Events ev = {0};
    Model *models = malloc(sizeof(Model));
    Inherit *inherit = calloc(1, sizeof(Inherit));
    const char *err = "out of memory";
    if (!cnt || !first || !at || !left || !keys || !models || !inherit) goto done;
    if (L->bits == 8) count_pass_8(b, g, n, L, keys, cnt, K);
    else if (L->bits == 16) count_pass_16(b, g, n, L, keys, cnt, K);
    else count_pass_32(b, g, n, L, keys, cnt, K);
    Dec d;
    dec_init(&d, data, len);
    for (int k = 0; k < K; k++) {
        first[k] = (uint32_t)ev.n;
        uint64_t seen = 0;
        for (int l = 0; l < LANES; l++) seen += cnt[l * K + k];
        if (!seen) continue;
        model_start(models, inherit, k / L->nexp);
        uint64_t next = dec_bit(&d, &models->any) ? 0 : seen;
        while (next < seen) {
            int64_t v = dec_golomb(&d, models->run_bucket, models->run_top, 32); /* runs: below 2^32 */
            uint64_t remaining = seen - next;
            if (v < 1 || (uint64_t)v - 1 > remaining) { err = "ULP_STEP payload: a run is longer than its context"; goto done; }
            if ((uint64_t)v - 1 == remaining) break; /* the zeros to the end */
            uint64_t rank = next + (uint64_t)v - 1;
            int negative;
            uint64_t mag = dec_value(&d, models, &negative, L->sign, L->bits - 1);
            if (!mag || (!negative && mag == L->sign)) { err = "ULP_STEP payload: a delta is out of range"; goto done; }
            uint64_t delta = (negative ? (L->mask - mag + 1) : mag) & L->mask;
            if (!push(&ev, (Event){(uint32_t)rank, (uint32_t)k, delta})) goto done;
            next = rank + 1;
        }
        model_end(models, inherit, k / L->nexp);
    }
    first[K] = (uint32_t)ev.n;
    if (d.at != len) { err = "ULP_STEP payload length does not match its contents"; goto done; }
    memcpy(x, b, (size_t)n * L->width);
    if (ev.n) {
        /* lane l holds ranks [base, base + cnt) of context k: its events are those in that range */
        for (int k = 0; k < K; k++) {
            uint32_t base = 0, e = first[k];
            for (int l = 0; l < LANES; l++) {
                uint32_t s = (uint32_t)(l * K + k), count = cnt[s];
                at[s] = e;
                while (e < first[k + 1] && ev.ev[e].rank < base + count) e++;
                left[s] = e - at[s];
                cnt[s] = left[s] ? ev.ev[at[s]].rank - base : UINT32_MAX; /* now the lane's skip */
                base += count;
            }
        }
        if (L->bits == 8) apply_pass_8(b, keys, n, K, cnt, at, left, ev.ev, x);
        else if (L->bits == 16) apply_pass_16(b, keys, n, K, cnt, at, left, ev.ev, x);
        else apply_pass_32(b, keys, n, K, cnt, at, left, ev.ev, x);
    }
    err = NULL;
done:
    free(cnt), free(first), free(at), free(left), free(keys), free(ev.ev), free(models), free(inherit);
    return err;
}

/* ---- STEP_BLOCKS (method 8): the same deltas in element order, by blocks of 64 ------------
 * ULP_STEP's contexts order the elements by (class, exponent): a decoder must count every
 * context's elements and then walk the chunk once more to find each rank's element, two
 * scalar passes (2.5 ns an element here) that cost 3-4x a keyframe's decode even when
 * nothing changed. This coder visits the elements in their own order, a block of 64 at a
 * time, and derives everything it conditions on from the block's own base and context:
 *   A = the block's elements whose base moved at the step before (b != g: class >= 1), as
 *       a 64-bit mask; the rest (Z) moved not, and mostly stay so;
 *   m = the smallest exponent among the block's Z elements (a small weight's unit in the
 *       last place is small: it is the one an update moves).
 * Per block: if it has Z elements, one flag "any Z element changed" in the context of (m,
 * whether the block before changed); when set, the same per part of 8 elements (context:
 * the part's smallest Z exponent, whether the part before changed), and in a changed part
 * each Z element's "changed" in the context of its exponent (the last one implied when none
 * before it changed), each change followed by its sign and size. Then each A element, in the
 * context of (its class, its exponent): "moved again as before (d = p)" -- 89.5% of them on
 * a real bf16 run, 99% of those that moved one unit -- else "changed", the direction, and
 * the size (the size before left out). Updates cluster (an embedding's rows): on a real bf16
 * fine-tune the block flags code the unmoved elements' positions in 0.84x the bits of
 * ULP_STEP's exponent contexts, and the step costs 0.96-0.99x ULP_STEP's bytes. A context
 * (class, exponent) starts, when first used, from the nearest started exponent of its class
 * within INHERIT_SPAN (counts capped at INHERIT_N), like ULP_STEP's neighbouring contexts.
 * docs/step-coders.md has the exact order. Decoding is one pass over b and g plus work per
 * change: no pass indexed by context.
 *
 * STEP_RUNS (the same functions with ``runs``): instead of a flag a block with Z elements,
 * a run of such blocks without a change before the next one with one, coded at that next
 * block's turn (whose "r = 0" decision takes the flag's context); the scan then needs no
 * exponent, only the A mask. Magnitudes by their log2 bucket (enc_log_magnitude). Written
 * for a step whose Z elements changed in few blocks (step.py's prefers_runs, z_blocks). */
#define BLOCK 64
#define SUB 8 /* a changed block's parts: each says whether its unmoved elements changed */
#define SUB_MASK 0xFFULL
#define INHERIT_SPAN 4
#define NO_EXP 0xFFFFu

#define LOG_BUCKETS 6 /* STEP_RUNS: magnitudes below 2^6 by their bucket, larger ones escape */

typedef struct {
    Bit flag, after, again, sign, mag[MAG_UNARY]; /* what each means: step.py's _Key */
    Bit top[LOG_BUCKETS - 1][3]; /* STEP_RUNS: the two bits below a magnitude's leading one */
} KeyModel;

typedef struct {
    Bit bucket[BUCKETS + 1];
    Bit top[BUCKETS + 1][3];
} Escape;

typedef struct {
    int nexp;
    KeyModel *keys; /* CLASSES * nexp, started when first used */
    uint8_t *have;
    Escape esc[CLASSES]; /* magnitudes beyond MAG_UNARY, by class */
    Bit *block;          /* 2 nexp: a block's "any Z element changed", by its smallest Z exponent */
    Bit *sub;            /* 2 nexp: the same for a part of a changed block */
    Escape run[2];       /* STEP_RUNS: a run of unchanged Z blocks (block[]: whether it is empty),
                          * by whether the run before was empty */
} Blocks;

static int blocks_init(Blocks *M, int nexp) {
    M->nexp = nexp;
    M->keys = malloc((size_t)CLASSES * nexp * sizeof(KeyModel));
    M->have = calloc((size_t)CLASSES * nexp, 1);
    M->block = malloc((size_t)2 * nexp * sizeof(Bit));
    M->sub = malloc((size_t)2 * nexp * sizeof(Bit));
    if (!M->keys || !M->have || !M->block || !M->sub) return 0;
    for (int k = 0; k < 2 * nexp; k++) M->block[k] = M->sub[k] = (Bit){0x80000000u, 0};
    Bit *e = (Bit *)M->esc;
    for (size_t k = 0; k < sizeof(M->esc) / (sizeof(Bit)); k++) e[k].p = 0x80000000u, e[k].n = 0;
    e = (Bit *)M->run;
    for (size_t k = 0; k < sizeof(M->run) / (sizeof(Bit)); k++) e[k].p = 0x80000000u, e[k].n = 0;
    return 1;
}

static void blocks_free(Blocks *M) { free(M->keys), free(M->have), free(M->block), free(M->sub); }

static KeyModel *key_start(Blocks *M, size_t at, int cls, int e);

static inline KeyModel *key_model(Blocks *M, int cls, int e) {
    size_t at = (size_t)cls * M->nexp + e;
    if (__builtin_expect(M->have[at], 1)) return &M->keys[at];
    return key_start(M, at, cls, e);
}

/* a context's first use: from the nearest started exponent of its class, else from one half */
static KeyModel *key_start(Blocks *M, size_t at, int cls, int e) {
    KeyModel *k = &M->keys[at];
    M->have[at] = 1;
    for (int s = 1; s <= INHERIT_SPAN; s++) /* the nearest started exponent, the lower first */
        for (int side = -1; side <= 1; side += 2) {
            int f = e + side * s;
            if (f < 0 || f >= M->nexp || !M->have[(size_t)cls * M->nexp + f]) continue;
            *k = M->keys[(size_t)cls * M->nexp + f];
            cap_counts((Bit *)k, sizeof(KeyModel) / sizeof(Bit));
            return k;
        }
    Bit *b = (Bit *)k;
    for (size_t j = 0; j < sizeof(KeyModel) / sizeof(Bit); j++) b[j].p = 0x80000000u, b[j].n = 0;
    return k;
}

/* STEP_RUNS's magnitude m >= 1: its bucket j = floor(log2 m) in unary (mag[0..j], up to
 * LOG_BUCKETS), then the j bits below the leading one, the first two through the tree top[j-1],
 * the rest direct; m >= 2^LOG_BUCKETS escapes as an exp-Golomb code of m - 2^LOG_BUCKETS + 1.
 * A large magnitude takes a few decisions instead of MAG_UNARY and an escape. */
static void enc_log_magnitude(Enc *e, KeyModel *k, Escape *x, uint64_t m) {
    int j = 63 - __builtin_clzll(m);
    for (int t = 0; t < j && t < LOG_BUCKETS; t++) enc_bit(e, &k->mag[t], 1);
    if (j >= LOG_BUCKETS) {
        enc_golomb(e, x->bucket, x->top, m - (1ULL << LOG_BUCKETS) + 1);
        return;
    }
    enc_bit(e, &k->mag[j], 0);
    for (int t = j - 1, node = 0; t >= 0; t--) {
        int bit = (int)((m >> t) & 1);
        if (t >= j - 2) enc_bit(e, &k->top[j - 1][node], bit), node = 1 + bit;
        else enc_direct(e, bit);
    }
}

/* the magnitude, or 0 when the escape's bucket passes max_bucket */
static inline uint64_t dec_log_magnitude(Dec *d, KeyModel *k, Escape *x, int max_bucket) {
    int j = 0;
    while (j < LOG_BUCKETS && dec_bit(d, &k->mag[j])) j++;
    if (j == LOG_BUCKETS) {
        int64_t v = dec_golomb(d, x->bucket, x->top, max_bucket);
        return v < 0 ? 0 : (uint64_t)v + (1ULL << LOG_BUCKETS) - 1;
    }
    uint64_t m = 1;
    for (int t = j - 1, node = 0; t >= 0; t--) {
        int bit;
        if (t >= j - 2) bit = dec_bit(d, &k->top[j - 1][node]), node = 1 + bit;
        else bit = dec_direct(d);
        m = (m << 1) | (uint64_t)bit;
    }
    return m;
}

static inline void enc_key_magnitude(Enc *e, KeyModel *k, Escape *x, uint64_t m, int runs) {
    if (runs) enc_log_magnitude(e, k, x, m);
    else enc_magnitude(e, k->mag, x->bucket, x->top, m);
}

/* a delta of the given sign and magnitude (masked to the width), or 0 when out of range.
 * ``skip``: a magnitude the coder left out (a moved element's size before, coded apart), so
 * a coded one at or past it is one more; 0 for none */
static inline uint64_t dec_key_delta(Dec *d, KeyModel *k, Escape *x, const Layout *L, int negative, uint64_t skip,
                                     int runs) {
    uint64_t mag = runs ? dec_log_magnitude(d, k, x, L->bits - 1)
                        : dec_magnitude(d, k->mag, x->bucket, x->top, L->bits - 1);
    if (!mag) return 0;
    if (skip && mag >= skip) mag++;
    if (mag > L->sign || (!negative && mag == L->sign)) return 0;
    return (negative ? L->mask - mag + 1 : mag) & L->mask;
}

/* 8 bytes of 0/1 -> 8 bits, byte j to bit j */
static inline uint64_t pack8(const uint8_t *v) {
    uint64_t w;
    memcpy(&w, v, 8);
    return (w * 0x0102040810204080ULL) >> 56;
}


#if defined(__SSE2__)
#include <emmintrin.h>
/* block_scan for 16- and 32-bit elements with SSE2 (every x86-64 has it): the portable loop
 * below vectorises poorly (0.37 ns an element against 0.05 here) */
static inline unsigned min_epi16_all(__m128i v) {
    v = _mm_min_epi16(v, _mm_srli_si128(v, 8));
    v = _mm_min_epi16(v, _mm_srli_si128(v, 4));
    v = _mm_min_epi16(v, _mm_srli_si128(v, 2));
    return (unsigned)(uint16_t)_mm_cvtsi128_si32(v);
}

static inline uint64_t block_scan_sse_16(const uint16_t *b, const uint16_t *g, int shift, unsigned emask,
                                         unsigned *min_exp, uint16_t *x) {
    const __m128i em = _mm_set1_epi16((short)emask), none = _mm_set1_epi16(0x7FFF);
    const __m128i sh = _mm_cvtsi32_si128(shift);
    __m128i mn = none;
    uint64_t a = 0;
    for (int q = 0; q < BLOCK / 16; q++) {
        __m128i moved2[2];
        for (int h = 0; h < 2; h++) {
            __m128i vb = _mm_loadu_si128((const __m128i *)(b + 16 * q + 8 * h));
            if (x) _mm_storeu_si128((__m128i *)(x + 16 * q + 8 * h), vb);
            __m128i eq = _mm_cmpeq_epi16(vb, _mm_loadu_si128((const __m128i *)(g + 16 * q + 8 * h)));
            __m128i e = _mm_and_si128(_mm_srl_epi16(vb, sh), em);
            e = _mm_or_si128(_mm_and_si128(eq, e), _mm_andnot_si128(eq, none));
            mn = _mm_min_epi16(mn, e);
            moved2[h] = _mm_andnot_si128(eq, _mm_set1_epi16(-1));
        }
        a |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_packs_epi16(moved2[0], moved2[1])) << (16 * q);
    }
    unsigned m = min_epi16_all(mn);
    *min_exp = m == 0x7FFF ? NO_EXP : m;
    return a;
}

static inline uint64_t block_scan_sse_32(const uint32_t *b, const uint32_t *g, int shift, unsigned emask,
                                         unsigned *min_exp, uint32_t *x) {
    const __m128i em = _mm_set1_epi32((int)emask), none = _mm_set1_epi32(0x7FFF);
    const __m128i sh = _mm_cvtsi32_si128(shift);
    __m128i mn = _mm_set1_epi16(0x7FFF);
    uint64_t a = 0;
    for (int q = 0; q < BLOCK / 16; q++) {
        __m128i moved[4], ex[4];
        for (int h = 0; h < 4; h++) {
            __m128i vb = _mm_loadu_si128((const __m128i *)(b + 16 * q + 4 * h));
            if (x) _mm_storeu_si128((__m128i *)(x + 16 * q + 4 * h), vb);
            __m128i eq = _mm_cmpeq_epi32(vb, _mm_loadu_si128((const __m128i *)(g + 16 * q + 4 * h)));
            __m128i e = _mm_and_si128(_mm_srl_epi32(vb, sh), em);
            ex[h] = _mm_or_si128(_mm_and_si128(eq, e), _mm_andnot_si128(eq, none));
            moved[h] = _mm_andnot_si128(eq, _mm_set1_epi32(-1));
        }
        mn = _mm_min_epi16(mn, _mm_min_epi16(_mm_packs_epi32(ex[0], ex[1]), _mm_packs_epi32(ex[2], ex[3])));
        __m128i m16 = _mm_packs_epi16(_mm_packs_epi32(moved[0], moved[1]), _mm_packs_epi32(moved[2], moved[3]));
        a |= (uint64_t)(uint16_t)_mm_movemask_epi8(m16) << (16 * q);
    }
    unsigned m = min_epi16_all(mn);
    *min_exp = m == 0x7FFF ? NO_EXP : m;
    return a;
}
/* the A mask alone (STEP_RUNS codes no block flag, which the smallest exponent is for) */
static inline uint64_t block_moved_sse_16(const uint16_t *b, const uint16_t *g, uint16_t *x) {
    uint64_t a = 0;
    for (int q = 0; q < BLOCK / 16; q++) {
        __m128i b0 = _mm_loadu_si128((const __m128i *)(b + 16 * q)), b1 = _mm_loadu_si128((const __m128i *)(b + 16 * q + 8));
        if (x) _mm_storeu_si128((__m128i *)(x + 16 * q), b0), _mm_storeu_si128((__m128i *)(x + 16 * q + 8), b1);
        __m128i e0 = _mm_cmpeq_epi16(b0, _mm_loadu_si128((const __m128i *)(g + 16 * q)));
        __m128i e1 = _mm_cmpeq_epi16(b1, _mm_loadu_si128((const __m128i *)(g + 16 * q + 8)));
        a |= (uint64_t)(uint16_t)~_mm_movemask_epi8(_mm_packs_epi16(e0, e1)) << (16 * q);
    }
    return a;
}

static inline uint64_t block_moved_sse_32(const uint32_t *b, const uint32_t *g, uint32_t *x) {
    uint64_t a = 0;
    for (int q = 0; q < BLOCK / 16; q++) {
        __m128i eq[4];
        for (int h = 0; h < 4; h++) {
            __m128i vb = _mm_loadu_si128((const __m128i *)(b + 16 * q + 4 * h));
            if (x) _mm_storeu_si128((__m128i *)(x + 16 * q + 4 * h), vb);
            eq[h] = _mm_cmpeq_epi32(vb, _mm_loadu_si128((const __m128i *)(g + 16 * q + 4 * h)));
        }
        __m128i m16 = _mm_packs_epi16(_mm_packs_epi32(eq[0], eq[1]), _mm_packs_epi32(eq[2], eq[3]));
        a |= (uint64_t)(uint16_t)~_mm_movemask_epi8(m16) << (16 * q);
    }
    return a;
}
/* each part's (SUB elements') smallest Z exponent, NO_EXP where it has none: one register a
 * part for 16-bit elements, where the loop over a part's Z elements was a fifth of a decode */
static inline void block_subs_sse_16(const uint16_t *b, const uint16_t *g, int shift, unsigned emask,
                                     unsigned *subs) {
    const __m128i em = _mm_set1_epi16((short)emask), none = _mm_set1_epi16(0x7FFF);
    const __m128i sh = _mm_cvtsi32_si128(shift);
    for (int s = 0; s < BLOCK / SUB; s++) {
        __m128i vb = _mm_loadu_si128((const __m128i *)(b + SUB * s));
        __m128i eq = _mm_cmpeq_epi16(vb, _mm_loadu_si128((const __m128i *)(g + SUB * s)));
        __m128i e = _mm_and_si128(_mm_srl_epi16(vb, sh), em);
        unsigned m = min_epi16_all(_mm_or_si128(_mm_and_si128(eq, e), _mm_andnot_si128(eq, none)));
        subs[s] = m == 0x7FFF ? NO_EXP : m;
    }
}
#define SUBS_SSE(BITS, b, g, len, shift, emask, subs) \
    if ((BITS) == 16 && SUB == 8 && (len) == BLOCK) { \
        block_subs_sse_16((const uint16_t *)(const void *)(b), (const uint16_t *)(const void *)(g), shift, emask, subs); \
        return; \
    }
#define MOVED_SSE(BITS, b, g, x, len) \
    if ((BITS) >= 16 && (len) == BLOCK) \
        return (BITS) == 16 ? block_moved_sse_16((const uint16_t *)(const void *)(b), (const uint16_t *)(const void *)(g), (uint16_t *)(void *)(x)) \
                            : block_moved_sse_32((const uint32_t *)(const void *)(b), (const uint32_t *)(const void *)(g), (uint32_t *)(void *)(x));
#define SCAN_SSE(BITS, b, g, x, len, shift, emask, mn) \
    if ((BITS) >= 16 && (len) == BLOCK) \
        return (BITS) == 16 ? block_scan_sse_16((const uint16_t *)(const void *)(b), (const uint16_t *)(const void *)(g), shift, emask, mn, (uint16_t *)(void *)(x)) \
                            : block_scan_sse_32((const uint32_t *)(const void *)(b), (const uint32_t *)(const void *)(g), shift, emask, mn, (uint32_t *)(void *)(x));
#else
#define SCAN_SSE(BITS, b, g, x, len, shift, emask, mn)
#define MOVED_SSE(BITS, b, g, x, len)
#define SUBS_SSE(BITS, b, g, len, shift, emask, subs)
#endif

/* A step context given as the elements where it differs from the base (a follower keeps
 * only those: an RL step moves ~3% of them): ``pos`` strictly ascending, ``val`` the
 * context's elements there. A block's context is rebuilt on the stack from the base. */
typedef struct {
    const int32_t *pos;
    const void *val;
    Py_ssize_t n;
} SparseContext;

/* The elements a decode changed, ascending (grown as needed): their positions, and their
 * values before and after. What a follower writes, keeps for its undo and as the next
 * step's context, instead of finding them by comparing the chunks and gathering. */
typedef struct {
    int32_t *pos;
    uint8_t *was, *now; /* ``width`` bytes an element */
    size_t n, cap;
    int width;
} Changes;

static int changes_add(Changes *c, Py_ssize_t i0, uint64_t mask, const void *b, const void *x) {
    size_t more = (size_t)__builtin_popcountll(mask);
    if (c->n + more > c->cap) {
        size_t cap = c->cap ? c->cap : 1024;
        while (cap < c->n + more) cap *= 2;
        int32_t *pos = realloc(c->pos, cap * sizeof(int32_t));
        if (pos) c->pos = pos;
        uint8_t *was = pos ? realloc(c->was, cap * c->width) : NULL;
        if (was) c->was = was;
        uint8_t *now = was ? realloc(c->now, cap * c->width) : NULL;
        if (!now) return 0;
        c->now = now, c->cap = cap;
    }
    for (; mask; mask &= mask - 1) {
        Py_ssize_t i = i0 + __builtin_ctzll(mask);
        c->pos[c->n] = (int32_t)i;
        if (c->width == 2) {
            ((uint16_t *)c->was)[c->n] = ((const uint16_t *)b)[i], ((uint16_t *)c->now)[c->n] = ((const uint16_t *)x)[i];
        } else if (c->width == 4) {
            ((uint32_t *)c->was)[c->n] = ((const uint32_t *)b)[i], ((uint32_t *)c->now)[c->n] = ((const uint32_t *)x)[i];
        } else {
            c->was[c->n] = ((const uint8_t *)b)[i], c->now[c->n] = ((const uint8_t *)x)[i];
        }
        c->n++;
    }
    return 1;
}

/* The block's A mask (b != g) and its smallest Z exponent (NO_EXP: none); ``len`` <= BLOCK. */
#define DEFINE_BLOCKS(T, ST, BITS)                                                             \
    static inline uint64_t block_scan_##BITS(const T *b, const T *g, T *x, int len, int shift, \
                                             unsigned emask, unsigned *min_exp) {              \
        SCAN_SSE(BITS, b, g, x, len, shift, emask, min_exp)                                    \
        if (x) memcpy(x, b, (size_t)len * sizeof(T));                                          \
        uint8_t ne[BLOCK] = {0};                                                               \
        T mn = (T)~(T)0; /* the exponents fit below the all-ones value: NO_EXP after */         \
        if (len == BLOCK) /* a constant trip count: vectorised whole */                        \
            for (int j = 0; j < BLOCK; j++) {                                                  \
                T moved = (T)(0 - (T)(b[j] != g[j]));                                          \
                T e = (T)(((b[j] >> shift) & emask) | moved);                                  \
                ne[j] = (uint8_t)(moved & 1);                                                  \
                mn = e < mn ? e : mn;                                                          \
            }                                                                                  \
        else                                                                                   \
            for (int j = 0; j < len; j++) {                                                    \
                T moved = (T)(0 - (T)(b[j] != g[j]));                                          \
                T e = (T)(((b[j] >> shift) & emask) | moved);                                  \
                ne[j] = (uint8_t)(moved & 1);                                                  \
                mn = e < mn ? e : mn;                                                          \
            }                                                                                  \
        *min_exp = mn == (T)~(T)0 ? NO_EXP : (unsigned)mn;                                     \
        uint64_t a = 0;                                                                        \
        for (int w = 0; w < BLOCK / 8; w++) a |= pack8(ne + 8 * w) << (8 * w);                 \
        return a;                                                                              \
    }                                                                                          \
    /* the A mask alone; ``x``: where to copy the block of b to, or NULL */                  \
    static inline uint64_t block_moved_##BITS(const T *b, const T *g, T *x, int len) {         \
        MOVED_SSE(BITS, b, g, x, len)                                                          \
        if (x) memcpy(x, b, (size_t)len * sizeof(T));                                          \
        uint8_t ne[BLOCK] = {0};                                                               \
        for (int j = 0; j < len; j++) ne[j] = (uint8_t)(b[j] != g[j]);                         \
        uint64_t a = 0;                                                                        \
        for (int w = 0; w < BLOCK / 8; w++) a |= pack8(ne + 8 * w) << (8 * w);                 \
        return a;                                                                              \
    }                                                                                          \
    static inline uint64_t block_changed_##BITS(const T *x, const T *b, int len) {             \
        uint8_t ne[BLOCK] = {0};                                                               \
        for (int j = 0; j < len; j++) ne[j] = (uint8_t)(x[j] != b[j]);                         \
        uint64_t c = 0;                                                                        \
        for (int w = 0; w < BLOCK / 8; w++) c |= pack8(ne + 8 * w) << (8 * w);                 \
        return c;                                                                              \
    }                                                                                          \
    /* the class of the element's step before, and its size in units (|p|) */                 \
    static inline int class_of_##BITS(T b, T g, T *size) {                                     \
        ST p = (ST)(T)(ORDERED(T, ST, BITS, b) - ORDERED(T, ST, BITS, g));                     \
        int neg = p < 0;                                                                       \
        T m = neg ? (T)(0 - (T)p) : (T)p;                                                      \
        *size = m;                                                                             \
        return (m > 0) + (m > 1) + (m > 3) + neg * 3;                                          \
    }                                                                                          \
    static inline unsigned sub_min_##BITS(const T *b, uint64_t zs, int shift, unsigned emask) { \
        unsigned mn = NO_EXP;                                                                  \
        while (zs) {                                                                           \
            unsigned e = (unsigned)((b[__builtin_ctzll(zs)] >> shift) & emask);                \
            mn = e < mn ? e : mn;                                                              \
            zs &= zs - 1;                                                                      \
        }                                                                                      \
        return mn;                                                                             \
    }                                                                                          \
    /* every part's sub_min (z: the block's Z elements) */                                     \
    static inline void block_subs_##BITS(const T *b, const T *g, int len, int shift, unsigned emask, \
                                         uint64_t z, unsigned *subs) {                         \
        SUBS_SSE(BITS, b, g, len, shift, emask, subs)                                          \
        for (int s = 0; s < BLOCK / SUB; s++)                                                  \
            subs[s] = sub_min_##BITS(b, z & (SUB_MASK << (SUB * s)), shift, emask);            \
    }                                                                                          \
    /* STEP_RUNS: the blocks with Z elements from i0 on that pass unchanged before the next   \
     * one that changes (all of them when none does) */                                        \
    static uint64_t zrun_##BITS(const T *x, const T *b, const T *g, Py_ssize_t n, Py_ssize_t i0) { \
        uint64_t r = 0;                                                                        \
        for (; i0 < n; i0 += BLOCK) {                                                          \
            int len = n - i0 < BLOCK ? (int)(n - i0) : BLOCK;                                  \
            uint64_t all = len == BLOCK ? ~0ULL : ((1ULL << len) - 1);                         \
            uint64_t z = ~block_moved_##BITS(b + i0, g + i0, NULL, len) & all;                 \
            if (!z) continue;                                                                  \
            if (block_changed_##BITS(x + i0, b + i0, len) & z) return r;                       \
            r++;                                                                               \
        }                                                                                      \
        return r;                                                                              \
    }                                                                                          \
    /* the blocks with Z elements, and of them those where one changed (which coder: step.py) */ \
    static void zcount_##BITS(const T *x, const T *b, const T *g, Py_ssize_t n, uint64_t *zs,    \
                              uint64_t *changed) {                                             \
        for (Py_ssize_t i0 = 0; i0 < n; i0 += BLOCK) {                                         \
            int len = n - i0 < BLOCK ? (int)(n - i0) : BLOCK;                                  \
            uint64_t all = len == BLOCK ? ~0ULL : ((1ULL << len) - 1);                         \
            uint64_t z = ~block_moved_##BITS(b + i0, g + i0, NULL, len) & all;                 \
            if (!z) continue;                                                                  \
            ++*zs;                                                                             \
            *changed += (block_changed_##BITS(x + i0, b + i0, len) & z) != 0;                  \
        }                                                                                      \
    }                                                                                          \
    static void encode_blocks_##BITS(Enc *e, const T *x, const T *b, const T *g, Py_ssize_t n, \
                                     const Layout *L, Blocks *M, int runs) {                   \
        const int shift = L->shift;                                                            \
        const unsigned emask = (unsigned)L->emask;                                             \
        int hot = 0; /* whether the last block with Z elements had a Z element change */      \
        int64_t pending = -1; /* STEP_RUNS: Z blocks left to pass unchanged; -1: none coded */ \
        for (Py_ssize_t i0 = 0; i0 < n; i0 += BLOCK) {                                         \
            int len = n - i0 < BLOCK ? (int)(n - i0) : BLOCK;                                  \
            const T *xb = x + i0, *bb = b + i0, *gb = g + i0;                                  \
            unsigned mn = NO_EXP;                                                              \
            uint64_t a = runs ? block_moved_##BITS(bb, gb, NULL, len)                          \
                              : block_scan_##BITS(bb, gb, NULL, len, shift, emask, &mn);      \
            uint64_t all = len == BLOCK ? ~0ULL : ((1ULL << len) - 1);                         \
            uint64_t z = ~a & all, changed = block_changed_##BITS(xb, bb, len);               \
            if (z) {                                                                           \
                uint64_t zc = changed & z;                                                     \
                if (!runs) enc_bit(e, &M->block[2 * mn + hot], zc != 0);                       \
                else if (pending < 0) {                                                        \
                    pending = (int64_t)zrun_##BITS(x, b, g, n, i0);                            \
                    block_scan_##BITS(bb, gb, NULL, len, shift, emask, &mn);                   \
                    enc_bit(e, &M->block[2 * mn + hot], pending == 0); /* this block changed */ \
                    if (pending) enc_golomb(e, M->run[hot].bucket, M->run[hot].top, (uint64_t)pending); \
                    hot = pending == 0;                                                        \
                }                                                                              \
                if (runs) pending = zc ? -1 : pending - 1;                                     \
                else hot = zc != 0;                                                            \
                unsigned subs[BLOCK / SUB];                                                    \
                if (zc) block_subs_##BITS(bb, gb, len, shift, emask, z, subs);                 \
                for (int s = 0, anysub = 0, lastsub = 0; zc && s < BLOCK / SUB; s++) {         \
                    uint64_t zs = z & (SUB_MASK << (SUB * s));                                 \
                    if (!zs) continue;                                                         \
                    uint64_t later = s + 1 < BLOCK / SUB ? z >> (SUB * (s + 1)) : 0;           \
                    int sc = (changed & zs) != 0;                                              \
                    if (later || anysub) /* else implied: the block's only changed part */     \
                        enc_bit(e, &M->sub[2 * subs[s] + lastsub], sc);                        \
                    lastsub = sc;                                                              \
                    if (!sc) continue;                                                         \
                    anysub = 1;                                                                \
                    for (int any = 0, last = 0; zs;) {                                         \
                        int j = __builtin_ctzll(zs);                                           \
                        zs &= zs - 1;                                                          \
                        KeyModel *k = key_model(M, 0, (int)((bb[j] >> shift) & emask));        \
                        int ch = (int)((changed >> j) & 1);                                    \
                        if (zs || any) enc_bit(e, last ? &k->after : &k->flag, ch);            \
                        last = ch;                                                             \
                        if (!ch) continue;                                                     \
                        any = 1;                                                               \
                        T d = (T)(ORDERED(T, ST, BITS, xb[j]) - ORDERED(T, ST, BITS, bb[j]));   \
                        int negative = (d & L->sign) != 0;                                     \
                        enc_bit(e, &k->sign, negative);                                        \
                        enc_key_magnitude(e, k, &M->esc[0], negative ? (L->mask - d + 1) & L->mask : d, runs); \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
            while (a) {                                                                        \
                int j = __builtin_ctzll(a);                                                    \
                a &= a - 1;                                                                    \
                T size;                                                                        \
                int cls = class_of_##BITS(bb[j], gb[j], &size);                                \
                KeyModel *k = key_model(M, cls, (int)((bb[j] >> shift) & emask));              \
                int ch = (int)((changed >> j) & 1);                                            \
                T d = (T)(ORDERED(T, ST, BITS, xb[j]) - ORDERED(T, ST, BITS, bb[j]));           \
                int negative = (d & L->sign) != 0;                                             \
                uint64_t mag = negative ? (L->mask - d + 1) & L->mask : d;                     \
                int again = ch && negative == (cls > 3) && mag == size;                        \
                enc_bit(e, &k->flag, again); /* moved again as before: the same way, as far */ \
                if (again) continue;                                                           \
                enc_bit(e, &k->after, ch);                                                     \
                if (!ch) continue;                                                             \
                enc_bit(e, &k->again, negative == (cls > 3)); /* the same way (another size) */ \
                if (negative == (cls > 3) && mag > size) mag--; /* (not as far as before) */    \
                enc_key_magnitude(e, k, &M->esc[cls], mag, runs);                              \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    /* the base is copied into x and the changed elements written; the context is g, or (g  \
     * NULL) ``sg``'s; ``ch``: where the changed positions go, or NULL */                      \
    static const char *decode_blocks_##BITS(Dec *d, const T *b, const T *g, Py_ssize_t n,      \
                                            const Layout *L, Blocks *M, T *x, int runs,        \
                                            const SparseContext *sg, Changes *ch) {            \
        const int shift = L->shift;                                                            \
        const unsigned emask = (unsigned)L->emask;                                             \
        int hot = 0; /* whether the last block with Z elements had a Z element change */      \
        int64_t pending = -1; /* STEP_RUNS: Z blocks left to pass unchanged; -1: none coded */ \
        Py_ssize_t gk = 0; /* sg: its next element */                                          \
        T gl[BLOCK];                                                                           \
        for (Py_ssize_t i0 = 0; i0 < n; i0 += BLOCK) {                                         \
            int len = n - i0 < BLOCK ? (int)(n - i0) : BLOCK;                                  \
            const T *bb = b + i0, *gb = gl;                                                    \
            if (g) gb = g + i0;                                                                \
            else if (gk == sg->n || sg->pos[gk] >= i0 + len) gb = bb; /* none moved: g is b */ \
            else {                                                                             \
                memcpy(gl, bb, (size_t)len * sizeof(T));                                       \
                for (; gk < sg->n && sg->pos[gk] < i0 + len; gk++)                             \
                    gl[sg->pos[gk] - i0] = ((const T *)sg->val)[gk];                           \
            }                                                                                  \
            uint64_t wrote = 0; /* the block's changed elements */                             \
            T *xb = x + i0;                                                                    \
            unsigned mn = NO_EXP;                                                              \
            uint64_t a;                                                                        \
            if (runs) a = block_moved_##BITS(bb, gb, xb, len); /* the base copied on the way */ \
            else a = block_scan_##BITS(bb, gb, xb, len, shift, emask, &mn);                    \
            uint64_t all = len == BLOCK ? ~0ULL : ((1ULL << len) - 1);                         \
            uint64_t z = ~a & all;                                                             \
            int zc = 0;                                                                        \
            if (z && !runs) zc = hot = dec_bit(d, &M->block[2 * mn + hot]);                    \
            else if (z) {                                                                      \
                if (pending < 0) {                                                             \
                    block_scan_##BITS(bb, gb, NULL, len, shift, emask, &mn);                   \
                    pending = dec_bit(d, &M->block[2 * mn + hot]) ? 0                          \
                            : dec_golomb(d, M->run[hot].bucket, M->run[hot].top, BUCKETS);     \
                    if (pending < 0 || pending > (n - i0 + BLOCK - 1) / BLOCK)                 \
                        return "STEP_RUNS payload: a run passes the end of the chunk";         \
                    hot = pending == 0;                                                        \
                }                                                                              \
                zc = pending == 0;                                                             \
                pending = zc ? -1 : pending - 1;                                               \
            }                                                                                  \
            unsigned subs[BLOCK / SUB];                                                        \
            if (zc) block_subs_##BITS(bb, gb, len, shift, emask, z, subs);                     \
            for (int s = 0, anysub = 0, lastsub = 0; zc && s < BLOCK / SUB; s++) {             \
                uint64_t zs = z & (SUB_MASK << (SUB * s));                                     \
                if (!zs) continue;                                                             \
                uint64_t later = s + 1 < BLOCK / SUB ? z >> (SUB * (s + 1)) : 0;               \
                lastsub = later || anysub ? dec_bit(d, &M->sub[2 * subs[s] + lastsub]) : 1;   \
                if (!lastsub) continue;                                                        \
                anysub = 1;                                                                    \
                for (int any = 0, last = 0; zs;) {                                             \
                    int j = __builtin_ctzll(zs);                                               \
                    zs &= zs - 1;                                                              \
                    KeyModel *k = key_model(M, 0, (int)((bb[j] >> shift) & emask));            \
                    last = !(zs || any) ? 1 : dec_bit(d, last ? &k->after : &k->flag);         \
                    if (!last) continue;                                                       \
                    any = 1;                                                                   \
                    uint64_t delta = dec_key_delta(d, k, &M->esc[0], L, dec_bit(d, &k->sign), 0, runs); \
                    if (!delta) return "STEP_BLOCKS payload: a delta is out of range";         \
                    xb[j] = ORDERED(T, ST, BITS, (T)(ORDERED(T, ST, BITS, bb[j]) + (T)delta));  \
                    wrote |= 1ULL << j;                                                        \
                }                                                                              \
            }                                                                                  \
            while (a) {                                                                        \
                int j = __builtin_ctzll(a);                                                    \
                a &= a - 1;                                                                    \
                T size;                                                                        \
                int cls = class_of_##BITS(bb[j], gb[j], &size);                                \
                KeyModel *k = key_model(M, cls, (int)((bb[j] >> shift) & emask));              \
                int negative = cls > 3; /* the way it moved before */                          \
                uint64_t delta;                                                                \
                if (dec_bit(d, &k->flag)) /* moved again as before: the same way, as far */     \
                    delta = size > L->sign || (!negative && size == L->sign) ? 0               \
                          : (negative ? L->mask - size + 1 : size) & L->mask;                  \
                else {                                                                         \
                    if (!dec_bit(d, &k->after)) continue; /* unchanged */                      \
                    int same_way = dec_bit(d, &k->again);                                      \
                    delta = dec_key_delta(d, k, &M->esc[cls], L, same_way ? negative : !negative, \
                                          same_way ? (uint64_t)size : 0, runs);                \
                }                                                                              \
                if (!delta) return "STEP_BLOCKS payload: a delta is out of range";             \
                xb[j] = ORDERED(T, ST, BITS, (T)(ORDERED(T, ST, BITS, bb[j]) + (T)delta));      \
                wrote |= 1ULL << j;                                                            \
            }                                                                                  \
            if (ch && wrote && !changes_add(ch, i0, wrote, b, x)) return "out of memory";      \
        }                                                                                      \
        return pending > 0 ? "STEP_RUNS payload: a run passes the end of the chunk" : NULL;    \
    }
DEFINE_BLOCKS(uint8_t, int8_t, 8)
DEFINE_BLOCKS(uint16_t, int16_t, 16)
DEFINE_BLOCKS(uint32_t, int32_t, 32)

static const char *encode_blocks_as(const uint8_t *x, const uint8_t *b, const uint8_t *g, Py_ssize_t n,
                                    const Layout *L, uint8_t **out, size_t *out_len, int runs) {
    Blocks M = {0};
    Enc e = {0, 0xFFFFFFFFu, 0, 1, 0, NULL, 0, 0, 0};
    const char *err = "out of memory";
    if (!blocks_init(&M, L->nexp)) goto done;
    if (L->bits == 8) encode_blocks_8(&e, x, b, g, n, L, &M, runs);
    else if (L->bits == 16) encode_blocks_16(&e, (const uint16_t *)x, (const uint16_t *)b, (const uint16_t *)g, n, L, &M, runs);
    else encode_blocks_32(&e, (const uint32_t *)x, (const uint32_t *)b, (const uint32_t *)g, n, L, &M, runs);
    if (!enc_finish(&e, out, out_len)) goto done;
    err = NULL;
done:
    blocks_free(&M), free(e.out);
    return err;
}

static const char *decode_blocks_as(const uint8_t *data, size_t len, const uint8_t *b, const uint8_t *g,
                                    Py_ssize_t n, const Layout *L, uint8_t *x, int runs, const SparseContext *sg,
                                    Changes *ch) {
    Blocks M = {0};
    const char *err = "out of memory";
    if (!blocks_init(&M, L->nexp)) goto done;
    Dec d;
    dec_init(&d, data, len);
    if (L->bits == 8) err = decode_blocks_8(&d, b, g, n, L, &M, x, runs, sg, ch);
    else if (L->bits == 16)
        err = decode_blocks_16(&d, (const uint16_t *)b, (const uint16_t *)g, n, L, &M, (uint16_t *)x, runs, sg, ch);
    else err = decode_blocks_32(&d, (const uint32_t *)b, (const uint32_t *)g, n, L, &M, (uint32_t *)x, runs, sg, ch);
    if (!err && d.at != len)
        err = runs ? "STEP_RUNS payload length does not match its contents"
                   : "STEP_BLOCKS payload length does not match its contents";
done:
    blocks_free(&M);
    return err;
}

static const char *encode_blocks(const uint8_t *x, const uint8_t *b, const uint8_t *g, Py_ssize_t n,
                                 const Layout *L, uint8_t **out, size_t *out_len) {
    return encode_blocks_as(x, b, g, n, L, out, out_len, 0);
}

static const char *decode_blocks(const uint8_t *data, size_t len, const uint8_t *b, const uint8_t *g, Py_ssize_t n,
                                 const Layout *L, uint8_t *x) {
    return decode_blocks_as(data, len, b, g, n, L, x, 0, NULL, NULL);
}

static const char *encode_runs(const uint8_t *x, const uint8_t *b, const uint8_t *g, Py_ssize_t n,
                               const Layout *L, uint8_t **out, size_t *out_len) {
    return encode_blocks_as(x, b, g, n, L, out, out_len, 1);
}

static const char *decode_runs(const uint8_t *data, size_t len, const uint8_t *b, const uint8_t *g, Py_ssize_t n,
                               const Layout *L, uint8_t *x) {
    return decode_blocks_as(data, len, b, g, n, L, x, 1, NULL, NULL);
}

/* ---- Python ------------------------------------------------------------------------------ */
/* The coders' Python calls: the buffers checked against the layout (``max_n``: the most
 * elements the coder indexes), the coder run without the GIL. */
typedef const char *(*EncodeFn)(const uint8_t *, const uint8_t *, const uint8_t *, Py_ssize_t, const Layout *,
                                uint8_t **, size_t *);
typedef const char *(*DecodeFn)(const uint8_t *, size_t, const uint8_t *, const uint8_t *, Py_ssize_t, const Layout *,
                                uint8_t *);

static PyObject *run_encode(PyObject *args, EncodeFn coder, const char *misfit, Py_ssize_t max_n) {
    Py_buffer x, b, g;
    int width, shift;
    if (!PyArg_ParseTuple(args, "y*y*y*ii", &x, &b, &g, &width, &shift)) return NULL;
    Layout L;
    PyObject *result = NULL;
    if (!layout(&L, width, shift) || x.len != b.len || x.len != g.len || x.len % width || x.len / width > max_n) {
        PyErr_SetString(PyExc_ValueError, misfit);
        goto done;
    }
    uint8_t *out = NULL;
    size_t len = 0;
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = coder(x.buf, b.buf, g.buf, x.len / width, &L, &out, &len);
    Py_END_ALLOW_THREADS
    if (err) PyErr_SetString(PyExc_MemoryError, err);
    else result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)len);
    free(out);
done:
    PyBuffer_Release(&x), PyBuffer_Release(&b), PyBuffer_Release(&g);
    return result;
}

static PyObject *run_decode(PyObject *args, DecodeFn coder, const char *misfit, Py_ssize_t max_n) {
    Py_buffer data, b, g;
    int width, shift;
    if (!PyArg_ParseTuple(args, "y*y*y*ii", &data, &b, &g, &width, &shift)) return NULL;
    Layout L;
    PyObject *result = NULL;
    if (!layout(&L, width, shift) || b.len != g.len || b.len % width || b.len / width > max_n) {
        PyErr_SetString(PyExc_ValueError, misfit);
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, b.len);
    if (!result) goto done;
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = coder(data.buf, (size_t)data.len, b.buf, g.buf, b.len / width, &L, (uint8_t *)PyBytes_AS_STRING(result));
    Py_END_ALLOW_THREADS
    if (err) {
        Py_CLEAR(result);
        PyErr_SetString(strcmp(err, "out of memory") ? PyExc_ValueError : PyExc_MemoryError, err);
    }
done:
    PyBuffer_Release(&data), PyBuffer_Release(&b), PyBuffer_Release(&g);
    return result;
}

/* ULP_STEP's ranks and event counts are 32-bit; STEP_BLOCKS indexes by Py_ssize_t */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    return run_encode(args, encode_step, "ULP_STEP encode: sizes, width or shift do not fit", (Py_ssize_t)UINT32_MAX);
}

static PyObject *py_decode(PyObject *self, PyObject *args) {
    return run_decode(args, decode_step, "ULP_STEP payload: sizes, width or shift do not fit", (Py_ssize_t)UINT32_MAX);
}

static PyObject *py_encode_blocks(PyObject *self, PyObject *args) {
    return run_encode(args, encode_blocks, "STEP_BLOCKS encode: sizes, width or shift do not fit", PY_SSIZE_T_MAX);
}

static PyObject *py_decode_blocks(PyObject *self, PyObject *args) {
    return run_decode(args, decode_blocks, "STEP_BLOCKS payload: sizes, width or shift do not fit", PY_SSIZE_T_MAX);
}

static PyObject *py_encode_runs(PyObject *self, PyObject *args) {
    return run_encode(args, encode_runs, "STEP_RUNS encode: sizes, width or shift do not fit", PY_SSIZE_T_MAX);
}

static PyObject *py_decode_runs(PyObject *self, PyObject *args) {
    return run_decode(args, decode_runs, "STEP_RUNS payload: sizes, width or shift do not fit", PY_SSIZE_T_MAX);
}

/* decode_changes(data, base, positions, values, width, shift, runs) -> (chunk, positions,
 * old values, new values): STEP_BLOCKS (runs 0) or STEP_RUNS in the context given sparsely
 * (int32 positions strictly ascending where it differs from the base, and its elements
 * there), with the elements the chunk changes from the base */
static PyObject *py_decode_changes(PyObject *self, PyObject *args) {
    Py_buffer data, b, pos, val;
    int width, shift, runs;
    if (!PyArg_ParseTuple(args, "y*y*y*y*iii", &data, &b, &pos, &val, &width, &shift, &runs)) return NULL;
    Layout L;
    PyObject *chunk = NULL, *result = NULL;
    Changes ch = {0};
    ch.width = width;
    SparseContext sg = {(const int32_t *)pos.buf, val.buf, pos.len / 4};
    int fits = layout(&L, width, shift) && b.len % width == 0 && b.len / width <= INT32_MAX && pos.len % 4 == 0
               && val.len == sg.n * width;
    for (Py_ssize_t k = 0; fits && k < sg.n; k++) /* (ascending, inside the chunk: the rebuild relies on it) */
        fits = sg.pos[k] >= 0 && sg.pos[k] < b.len / width && (k == 0 || sg.pos[k] > sg.pos[k - 1]);
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "step decode_changes: sizes, width, shift or context positions do not fit");
        goto done;
    }
    chunk = PyBytes_FromStringAndSize(NULL, b.len);
    if (!chunk) goto done;
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = decode_blocks_as(data.buf, (size_t)data.len, b.buf, NULL, b.len / width, &L,
                           (uint8_t *)PyBytes_AS_STRING(chunk), runs != 0, &sg, &ch);
    Py_END_ALLOW_THREADS
    if (err) {
        PyErr_SetString(strcmp(err, "out of memory") ? PyExc_ValueError : PyExc_MemoryError, err);
        goto done;
    }
    static const char none[1] = {0};
    result = Py_BuildValue("(Oy#y#y#)", chunk, ch.n ? (const char *)ch.pos : none, (Py_ssize_t)(ch.n * 4),
                           ch.n ? (const char *)ch.was : none, (Py_ssize_t)(ch.n * width),
                           ch.n ? (const char *)ch.now : none, (Py_ssize_t)(ch.n * width));
done:
    Py_XDECREF(chunk);
    free(ch.pos), free(ch.was), free(ch.now);
    PyBuffer_Release(&data), PyBuffer_Release(&b), PyBuffer_Release(&pos), PyBuffer_Release(&val);
    return result;
}

static PyObject *py_z_blocks(PyObject *self, PyObject *args) {
    Py_buffer x, b, g;
    int width;
    if (!PyArg_ParseTuple(args, "y*y*y*i", &x, &b, &g, &width)) return NULL;
    PyObject *result = NULL;
    if ((width != 1 && width != 2 && width != 4) || x.len != b.len || x.len != g.len || x.len % width) {
        PyErr_SetString(PyExc_ValueError, "z_blocks: sizes or width do not fit");
        goto done;
    }
    uint64_t zs = 0, changed = 0;
    Py_ssize_t n = x.len / width;
    Py_BEGIN_ALLOW_THREADS
    if (width == 1) zcount_8(x.buf, b.buf, g.buf, n, &zs, &changed);
    else if (width == 2) zcount_16(x.buf, b.buf, g.buf, n, &zs, &changed);
    else zcount_32(x.buf, b.buf, g.buf, n, &zs, &changed);
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("KK", (unsigned long long)zs, (unsigned long long)changed);
done:
    PyBuffer_Release(&x), PyBuffer_Release(&b), PyBuffer_Release(&g);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(x, base, context, width, shift) -> the coded deltas of x against base (ULP_STEP)"},
    {"decode", py_decode, METH_VARARGS,
     "decode(data, base, context, width, shift) -> the chunk (ValueError on a corrupt payload)"},
    {"encode_blocks", py_encode_blocks, METH_VARARGS,
     "encode_blocks(x, base, context, width, shift) -> the coded deltas of x against base (STEP_BLOCKS)"},
    {"decode_blocks", py_decode_blocks, METH_VARARGS,
     "decode_blocks(data, base, context, width, shift) -> the chunk (ValueError on a corrupt payload)"},
    {"encode_runs", py_encode_runs, METH_VARARGS,
     "encode_runs(x, base, context, width, shift) -> the coded deltas of x against base (STEP_RUNS)"},
    {"decode_runs", py_decode_runs, METH_VARARGS,
     "decode_runs(data, base, context, width, shift) -> the chunk (ValueError on a corrupt payload)"},
    {"decode_changes", py_decode_changes, METH_VARARGS,
     "decode_changes(data, base, positions, values, width, shift, runs) -> (chunk, changed int32 positions, their old values, their new values)"},
    {"z_blocks", py_z_blocks, METH_VARARGS,
     "z_blocks(x, base, context, width) -> (blocks with unmoved elements, those where one of them changed)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_step", NULL, -1, methods};

PyMODINIT_FUNC PyInit__step(void) {
    build_recip();
    return PyModule_Create(&module);
}
