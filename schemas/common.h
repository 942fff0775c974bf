/*
 * common.h — small pieces every part of Spindle links: the error struct,
 * the planner's arena, growable arrays, hashing and checked arithmetic.
 * No I/O policy lives here: library code fills an sp_err_t and returns a
 * negative code; only main() decides to print and exit.
 */
#ifndef SPINDLE_COMMON_H
#define SPINDLE_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SP_VERSION "0.1.0"

/* Exit statuses shared by every program. */
enum { SP_EXIT_OK = 0, SP_EXIT_FAIL = 1, SP_EXIT_INPUT = 2 };

/* Error codes returned by library functions (always negative). */
enum {
	SP_EINPUT = -2,   /* bad input: the user can act on it */
	SP_ENOMEM = -3,   /* allocation failed */
	SP_EIO = -4,      /* reading or writing a file failed */
	SP_EINFEAS = -5,  /* no plan satisfies the constraints */
	SP_EINTERNAL = -6 /* a bug of ours; message says where */
};

/* ---- err.c ---------------------------------------------------------- */

/*
 * One error, filled by the first function that detects it and passed up
 * untouched. Printed as
 *   file:line:col: path: message
 *   hint: hint
 * with the parts that are unknown (line 0, empty path) left out.
 *
 * Warnings (a problem that does not stop the work) travel the same way:
 * library code fills an sp_err_t of its own (code 0) and passes it to
 * sp_err_warn, which hands it to the caller's warn function when the caller
 * set one (main() prints it with sp_warn_print) and drops it otherwise.
 * sp_err_set leaves warn and warn_ctx alone.
 */
typedef struct sp_err {
	int code;
	char file[256];
	int line, col;
	char path[256];
	char msg[512];
	char hint[256];
	void (*warn)(void *ctx, const struct sp_err *w);
	void *warn_ctx;
} sp_err_t;

/* Sets *e unless it already holds an error; returns code. */
int sp_err_set(sp_err_t *e, int code, const char *file, int line, int col,
	       const char *path, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
/* Adds a hint to the error already in e. */
void sp_err_hint(sp_err_t *e, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
void sp_err_print(FILE *f, const sp_err_t *e);
/* Passes warning w to e's warn function, if e has one. */
void sp_err_warn(const sp_err_t *e, const sp_err_t *w);
/* Prints w like sp_err_print, its message after "warning: ". */
void sp_warn_print(FILE *f, const sp_err_t *w);
/* Levenshtein-closest of names[0..n) to s, or NULL when none is close. */
const char *sp_closest(const char *s, const char *const *names, int n);

/* ---- arena.c -------------------------------------------------------- */

/*
 * Bump allocator; everything of one planning run is freed at once. A mark
 * taken with sp_arena_mark and given back to sp_arena_reset frees, in one
 * step, everything allocated since (LIFO scopes: a candidate plan, one
 * trial schedule), so passes that allocate from it need no cleanup lists.
 */
typedef struct sp_arena_block sp_arena_block_t;
typedef struct sp_arena {
	sp_arena_block_t *head;
	size_t used_total;
	sp_arena_block_t *spare; /* blocks a reset gave back, kept for reuse */
} sp_arena_t;
typedef struct {
	sp_arena_block_t *block;
	size_t used, used_total;
} sp_arena_mark_t;

void sp_arena_init(sp_arena_t *a);
void sp_arena_release(sp_arena_t *a);
/* Zeroed memory, aligned to 16; NULL on overflow or allocation failure. */
void *sp_arena_alloc(sp_arena_t *a, size_t n);
void *sp_arena_calloc(sp_arena_t *a, size_t count, size_t size);
/* count elements of size, not zeroed: for arrays the caller writes before
 * it reads (NULL as sp_arena_calloc). */
void *sp_arena_array(sp_arena_t *a, size_t count, size_t size);
sp_arena_mark_t sp_arena_mark(const sp_arena_t *a);
/* Frees everything allocated after m was taken (m must be still live);
 * its blocks stay with the arena for later allocations (already mapped:
 * a planner resets per candidate, and fresh pages cost more than
 * zeroing them again) until sp_arena_release. */
void sp_arena_reset(sp_arena_t *a, sp_arena_mark_t m);
/* sp_grow in an arena: a larger array is copied, the old one stays until
 * the arena (or its enclosing mark) is reset. */
int sp_arena_grow(sp_arena_t *a, void **p, int *cap, int need, size_t sz);

/* ---- vec: growable arrays on the heap -------------------------------- */

/* Ensures room for need elements of size sz in *p (capacity *cap). */
int sp_grow(void **p, int *cap, int need, size_t sz);
#define SP_PUSH(arr, n, cap, val)                                           \
	(sp_grow((void **)&(arr), &(cap), (n) + 1, sizeof(*(arr))) == 0       \
		 ? ((arr)[(n)++] = (val), 0)                                  \
		 : SP_ENOMEM)

/* ---- hash.c --------------------------------------------------------- */

/* 64-bit FNV-1a, chainable through h (start with SP_FNV_INIT). */
#define SP_FNV_INIT 0xcbf29ce484222325ULL
uint64_t sp_fnv1a(uint64_t h, const void *data, size_t n);
/* CRC-32 (IEEE, reflected), chainable: start with 0. */
uint32_t sp_crc32(uint32_t crc, const void *data, size_t n);
/* SplitMix64: a stateless mixer for deterministic pseudo-random streams. */
static inline uint64_t sp_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}
/* Uniform in [0,1) from a 64-bit key. */
static inline double sp_unit(uint64_t key)
{
	return (double)(sp_mix64(key) >> 11) * (1.0 / 9007199254740992.0);
}

/* ---- checked arithmetic --------------------------------------------- */

/* Multiplies/adds, setting *ovf on signed 64-bit overflow. */
static inline int64_t sp_mul(int64_t a, int64_t b, int *ovf)
{
	int64_t r;
	if (__builtin_mul_overflow(a, b, &r)) {
		*ovf = 1;
		return INT64_MAX;
	}
	return r;
}
static inline int64_t sp_add(int64_t a, int64_t b, int *ovf)
{
	int64_t r;
	if (__builtin_add_overflow(a, b, &r)) {
		*ovf = 1;
		return INT64_MAX;
	}
	return r;
}

#define SP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SP_ARRAY_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Writes s as a JSON string literal (quotes, escapes, \uXXXX controls). */
void sp_json_str(FILE *f, const char *s);
/* Reads a whole file; *out is NUL-terminated; caller frees. */
int sp_read_file(char **out, size_t *out_len, const char *path, sp_err_t *err);
/* Parses a file's text into out: every loader's *_load, given its *_parse. */
typedef int (*sp_parse_fn)(void *out, const char *text, size_t len, const char *fname,
			   sp_err_t *err);
int sp_parse_file(void *out, sp_parse_fn parse, const char *path, sp_err_t *err);
/*
 * Writes data to path atomically: a temporary file in the same directory,
 * fsync, rename. On failure nothing is left at path or at the temp name.
 */
int sp_write_atomic(const char *path, const void *data, size_t n, sp_err_t *err);
/* SP_EINPUT (err set) when path cannot name a file to write: empty, a
 * directory (it exists as one, or ends in '/'), or where no file can be
 * made (a probe file beside it, removed at once); SP_ENOMEM. A program
 * checks it before long work that ends in a write; sp_write_atomic
 * refuses the first two itself. */
int sp_output_check(const char *path, sp_err_t *err);

#endif
