/*
 * alloc_wrap.h — the -Wl,--wrap targets of the tests that fail allocations
 * on purpose (test_loaders.c, test_plan_oom.c): every malloc, calloc and
 * realloc of the test executable asks should_fail(), which the including
 * file defines, and returns NULL when it says so. Include it in exactly one
 * file of an executable, after should_fail's definition. Without
 * HAVE_WRAP (no --wrap in the linker) it is empty.
 */
#ifdef HAVE_WRAP
void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);

void *__wrap_malloc(size_t n)
{
	return should_fail() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
	return should_fail() ? NULL : __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
	return should_fail() ? NULL : __real_realloc(p, n);
}
#endif
