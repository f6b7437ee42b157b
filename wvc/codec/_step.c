/* The step-context coder of ULP_STEP (method 7): a float chunk's ULP deltas against its
 * base, each coded in the context of the same element's previous step (the base's own
 * delta against *its* base) and of the base's exponent. docs/design.md, "ULP_STEP", is
 * the format; codec/step.py is the Python twin, which writes and reads the same bytes.
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

static void model_start(Model *m, Inherit *h, int cls) {
    if (!h->have[cls]) { model_init(m); return; }
    *m = h->last[cls];
    Bit *b = (Bit *)m;
    for (size_t k = 0; k < sizeof(Model) / sizeof(Bit); k++) if (b[k].n > INHERIT_N) b[k].n = INHERIT_N;
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

/* a nonzero delta: sign, then |d| - 1 in unary up to MAG_UNARY, beyond it an escape */
static void enc_value(Enc *e, Model *m, int negative, uint64_t mag) {
    enc_bit(e, &m->sign, negative);
    uint64_t u = mag - 1;
    for (uint64_t t = 0; t < u && t < MAG_UNARY; t++) enc_bit(e, &m->mag[t], 1);
    if (u < MAG_UNARY) enc_bit(e, &m->mag[u], 0);
    else enc_golomb(e, m->mag_bucket, m->mag_top, u - MAG_UNARY + 1);
}

/* the magnitude, or 0 when invalid (beyond max_mag) */
static uint64_t dec_value(Dec *d, Model *m, int *negative, uint64_t max_mag, int max_bucket) {
    *negative = dec_bit(d, &m->sign);
    uint64_t u = 0;
    while (u < MAG_UNARY && dec_bit(d, &m->mag[u])) u++;
    if (u == MAG_UNARY) {
        int64_t v = dec_golomb(d, m->mag_bucket, m->mag_top, max_bucket);
        if (v < 0) return 0;
        u = MAG_UNARY + (uint64_t)v - 1;
    }
    return u + 1 > max_mag ? 0 : u + 1;
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
    /* the final value: the one in [low, low + range) with the most trailing zero bits, whose
     * zero bytes are then not written (the decoder reads zeros past the end) */
    for (int m = 32; m >= 0; m--) {
        uint64_t v = (e.low + (1ULL << m) - 1) & ~((1ULL << m) - 1);
        if (v < e.low + e.range) { e.low = v; break; }
    }
    for (int k = 0; k < 5; k++) shift_low(&e);
    if (e.nomem) goto done;
    while (e.len && e.out[e.len - 1] == 0) e.len--; /* the decoder reads zeros past the end */
    *out = e.out, *out_len = e.len;
    e.out = NULL;
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

/* ---- Python ------------------------------------------------------------------------------ */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    Py_buffer x, b, g;
    int width, shift;
    if (!PyArg_ParseTuple(args, "y*y*y*ii", &x, &b, &g, &width, &shift)) return NULL;
    Layout L;
    PyObject *result = NULL;
    if (!layout(&L, width, shift) || x.len != b.len || x.len != g.len || x.len % width ||
        x.len / width > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "ULP_STEP encode: sizes, width or shift do not fit");
        goto done;
    }
    uint8_t *out = NULL;
    size_t len = 0;
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = encode_step(x.buf, b.buf, g.buf, x.len / width, &L, &out, &len);
    Py_END_ALLOW_THREADS
    if (err) PyErr_SetString(PyExc_MemoryError, err);
    else result = PyBytes_FromStringAndSize((const char *)out, (Py_ssize_t)len);
    free(out);
done:
    PyBuffer_Release(&x), PyBuffer_Release(&b), PyBuffer_Release(&g);
    return result;
}

static PyObject *py_decode(PyObject *self, PyObject *args) {
    Py_buffer data, b, g;
    int width, shift;
    if (!PyArg_ParseTuple(args, "y*y*y*ii", &data, &b, &g, &width, &shift)) return NULL;
    Layout L;
    PyObject *result = NULL;
    if (!layout(&L, width, shift) || b.len != g.len || b.len % width || b.len / width > (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "ULP_STEP payload: sizes, width or shift do not fit");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, b.len);
    if (!result) goto done;
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = decode_step(data.buf, (size_t)data.len, b.buf, g.buf, b.len / width, &L, (uint8_t *)PyBytes_AS_STRING(result));
    Py_END_ALLOW_THREADS
    if (err) {
        Py_CLEAR(result);
        PyErr_SetString(strcmp(err, "out of memory") ? PyExc_ValueError : PyExc_MemoryError, err);
    }
done:
    PyBuffer_Release(&data), PyBuffer_Release(&b), PyBuffer_Release(&g);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", py_encode, METH_VARARGS,
     "encode(x, base, context, width, shift) -> the coded deltas of x against base (ULP_STEP)"},
    {"decode", py_decode, METH_VARARGS,
     "decode(data, base, context, width, shift) -> the chunk (ValueError on a corrupt payload)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_step", NULL, -1, methods};

PyMODINIT_FUNC PyInit__step(void) {
    build_recip();
    return PyModule_Create(&module);
}
