#include "banyan_heap.h"

#if defined(__linux__)
#include <malloc.h>
#endif

size_t banyan_heap_free_bytes(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    struct mallinfo2 info = mallinfo2();
    return info.fordblks;
#else
    return 0;
#endif
}

int banyan_heap_trim(void) {
#if defined(__GLIBC__)
    return malloc_trim(0);
#else
    return 0;
#endif
}
