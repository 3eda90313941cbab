#ifndef BANYAN_HEAP_H
#define BANYAN_HEAP_H

#include <stddef.h>

/// Bytes free inside the allocator's heap (glibc's `mallinfo2().fordblks`: freed memory the
/// process still holds, resident or not); 0 where the C library does not say.
size_t banyan_heap_free_bytes(void);

/// Hands the heap's free pages back to the system (glibc's `malloc_trim(0)`). Returns 1 when
/// memory was released, 0 otherwise or where the C library has no such call.
int banyan_heap_trim(void);

#endif
