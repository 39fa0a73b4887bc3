/* The entries of einjit's thread team (`team.c`, one shared library per process), which each
 * multithreaded program's libgomp entries (`team_entries.c`) pass their calls on to. */

#ifndef EINJIT_TEAM_H
#define EINJIT_TEAM_H

#include <stdbool.h>

#define EINJIT_TEAM_API __attribute__((visibility("default")))

EINJIT_TEAM_API void einjit_team_parallel(void (*fn)(void *), void *data, unsigned num_threads);
EINJIT_TEAM_API void einjit_team_parallel_loop(void (*fn)(void *), void *data, unsigned num_threads, long start,
                                               long end, long incr, long chunk);
EINJIT_TEAM_API bool einjit_team_loop_start(long start, long end, long incr, long chunk, long *istart, long *iend);
EINJIT_TEAM_API bool einjit_team_loop_next(long *istart, long *iend);
EINJIT_TEAM_API void einjit_team_loop_end(bool wait);
EINJIT_TEAM_API bool einjit_team_single_start(void);
EINJIT_TEAM_API void einjit_team_barrier(void);
EINJIT_TEAM_API void einjit_team_critical(bool enter);
EINJIT_TEAM_API int einjit_team_thread_num(void);
EINJIT_TEAM_API int einjit_team_num_threads(void);

#endif
