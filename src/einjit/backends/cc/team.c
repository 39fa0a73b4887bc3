/* einjit's thread team: the OpenMP runtime of einjit's multithreaded programs. It is one
 * shared library per process (named by a digest of its sources), which every such program
 * needs by its soname: each program's libgomp entries (`team_entries.c`, hidden in the
 * program) pass their calls on to it, so all the programs of a process share its teams and
 * their workers (a process that compiles many routines keeps one team's workers, not one
 * team's per routine, and a routine called after another finds the workers awake).
 *
 * Why not libgomp: a libgomp thread that finds no work spins a fixed count, then sleeps on
 * a futex. Spinning long (`OMP_WAIT_POLICY=active`) made `a @ b` at 2 threads 81% of the
 * 2-core peak against 53-70% with einjit's short count (1,000 rounds), because a sleeping
 * thread is woken at each routine call; and it made a 2-thread GPT step 10-15x slower than 1
 * thread on a machine other processes keep busy, because a spinning thread holds the core its
 * partner needs. A libgomp count is read once, when libgomp loads. Here every wait (a worker
 * for the next region, a thread at a barrier or for a construct's slot) spins, then sleeps on
 * a futex, and the spin adapts to the machine:
 * - while the machine is quiet a wait spins up to `SPIN_MAX_NS` (2 ms): back-to-back calls
 *   and the barriers between nests find every thread awake, as `active` does;
 * - once two of the team's threads were preempted within `PAIR_NS` (50 ms) of each other
 *   (a thread sees that from its count of involuntary context switches, read when a wait
 *   outlasts its first 64 polls, or from the clock jumping while it spins), the machine is
 *   busy: for the next `BUSY_NS` (0.2 s: a busy machine stays busy, and a thread that spins
 *   2 ms each time it finds out again loses what sleeping saved) waits spin `SPIN_MIN_NS`
 *   (20 us) only, then sleep, so the other processes (and a descheduled partner) get the
 *   cores.
 * The waker makes a futex call only when a thread sleeps.
 *
 * Teams: the process keeps up to `MAX_TEAMS` teams; a thread starting a region takes a free one
 * of its size (creating its workers the first time), so two threads can run routines at once.
 * A region started inside a region, or when no team is free or a worker cannot be created,
 * runs on the calling thread alone: einjit's threaded code computes the same values on any
 * number of threads. Workers block all signals, live as long as the process, and are
 * forgotten in a child after `fork` (the child creates its own).
 *
 * Work sharing: each thread counts the constructs (loops, singles) it meets in a region, in
 * the same order as every other thread; construct m lives in slot m % WS_SLOTS, which a
 * thread reuses only after every thread has finished construct m - WS_SLOTS. The count goes
 * on from one region of a team to its next, so a region starts with its slots ready (setting
 * the 16 slots up again took 48 atomic stores per region, to lines the workers used last).
 * A dynamic loop hands out chunks with one atomic add; a single goes to the thread that sets
 * its slot up. */

#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "team.h"

#define LINE 64
#define MAX_TEAMS 8
#define MAX_THREADS 256
#define WS_SLOTS 16u
#define SPIN_MIN_NS 20000L
#define SPIN_MAX_NS 2000000L
#define PREEMPTED_NS 100000L
#define PAIR_NS 50000000L
#define BUSY_NS 200000000L

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void relax(void) { _mm_pause(); }
#else
static inline void relax(void) { __asm__ __volatile__("" ::: "memory"); }
#endif

/* A word threads wait on for a change, with the count of those sleeping on it. */
typedef struct {
  _Alignas(LINE) atomic_uint word;
  atomic_int sleepers;
} Signal;

/* One construct's slot. Construct numbers are counted modulo 2^32 (a region meets fewer). */
typedef struct {
  Signal free;       /* the construct the slot may be set up for next */
  Signal ready;      /* the construct whose fields below are set */
  atomic_uint owner; /* the construct that last claimed the slot */
  atomic_int left;   /* threads still in that construct */
  _Alignas(LINE) atomic_long next; /* a dynamic loop's next iteration */
  long end, incr, chunk;
} WorkShare;

typedef struct Team {
  atomic_int busy;
  int created, n;
  atomic_int hired;    /* workers started so far: the next one's id */
  unsigned first_word; /* `start.word` when the workers were started */
  void (*fn)(void *);
  void *data;
  bool loop;    /* the region began with construct `base`, a loop set up by its master */
  unsigned base; /* the number of the region's first construct */
  Signal start;   /* bumped when the team's master starts a region */
  Signal barrier; /* bumped when the last thread reaches a barrier */
  _Alignas(LINE) atomic_int arrived;
  WorkShare ws[WS_SLOTS];
} Team;

typedef struct {
  Team *team;
  int id;
  unsigned constructs; /* the number of the next construct it meets */
  unsigned current;    /* the loop being shared out */
} Member;

static Team teams[MAX_TEAMS];
static __thread Member *me;
static atomic_long busy_until;     /* until when waits spin `SPIN_MIN_NS` only */
static atomic_long last_preempted; /* when a thread last found it was preempted */
static pthread_mutex_t critical = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void futex(atomic_uint *word, int op, unsigned value) {
  syscall(SYS_futex, (unsigned *)word, op | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

/* A thread was preempted at `t`: the machine is busy if another one was, not long before. */
static void preempted(long t) {
  long before = atomic_exchange_explicit(&last_preempted, t, memory_order_relaxed);
  if (t - before < PAIR_NS) atomic_store_explicit(&busy_until, t + BUSY_NS, memory_order_relaxed);
}

/* Note whether the calling thread was preempted since it last looked. */
static void note_preemptions(long t) {
  static __thread long seen;
  struct rusage usage;
  if (getrusage(RUSAGE_THREAD, &usage) == 0 && usage.ru_nivcsw != seen) {
    seen = usage.ru_nivcsw;
    preempted(t);
  }
}

/* Wait until `s->word` is no longer `old`: spin (for `SPIN_MIN_NS` while the machine is busy,
   else up to `SPIN_MAX_NS`), then sleep. */
static void await_change(Signal *s, unsigned old) {
  for (int k = 0; k < 64; ++k) {
    if (atomic_load_explicit(&s->word, memory_order_acquire) != old) return;
    relax();
  }
  long start = now_ns(), last = start;
  note_preemptions(start);
  long budget = start < atomic_load_explicit(&busy_until, memory_order_relaxed) ? SPIN_MIN_NS : SPIN_MAX_NS;
  for (;;) {
    for (int k = 0; k < 32; ++k) {
      if (atomic_load_explicit(&s->word, memory_order_acquire) != old) return;
      relax();
    }
    long t = now_ns();
    if (t - last > PREEMPTED_NS) {
      preempted(t);
      break;
    }
    if (t - start > budget) break;
    last = t;
  }
  while (atomic_load(&s->word) == old) {
    atomic_fetch_add(&s->sleepers, 1);
    futex(&s->word, FUTEX_WAIT, old);
    atomic_fetch_sub(&s->sleepers, 1);
  }
}

static void wake(Signal *s) {
  if (atomic_load(&s->sleepers) > 0) futex(&s->word, FUTEX_WAKE, INT_MAX);
}

static void signal_change(Signal *s) {
  atomic_fetch_add(&s->word, 1);
  wake(s);
}

static void signal_value(Signal *s, unsigned value) {
  atomic_store(&s->word, value);
  wake(s);
}

/* Wait until `s->word` is `value` (`exact`) or past it. */
static void await_value(Signal *s, unsigned value, bool exact) {
  for (;;) {
    unsigned now = atomic_load_explicit(&s->word, memory_order_acquire);
    if (exact ? now == value : (int)(now - value) >= 0) return;
    await_change(s, now);
  }
}

static void team_barrier(Team *t) {
  if (t->n == 1) return;
  unsigned gen = atomic_load(&t->barrier.word);
  if (atomic_fetch_add(&t->arrived, 1) == t->n - 1) {
    atomic_store(&t->arrived, 0);
    signal_change(&t->barrier);
  } else {
    await_change(&t->barrier, gen);
  }
}

static void reset_constructs(Team *t) {
  for (unsigned k = 0; k < WS_SLOTS; ++k) {
    atomic_store(&t->ws[k].free.word, k);
    atomic_store(&t->ws[k].ready.word, UINT_MAX);
    atomic_store(&t->ws[k].owner, k - WS_SLOTS);
  }
}

/* The calling thread's place in its team; outside any region, in a team of its own (an
   orphaned construct met by serial code runs on its thread alone). */
static Member *member(void) {
  static __thread Member alone;
  if (me) return me;
  if (!alone.team) {
    alone.team = aligned_alloc(LINE, sizeof(Team));
    if (!alone.team) abort();
    memset(alone.team, 0, sizeof(Team));
    alone.team->n = 1;
    reset_constructs(alone.team);
  }
  return &alone;
}

/* The calling thread's next construct: the slot, set up by whichever thread came first
   (`*first` tells whether that was the caller). */
static WorkShare *enter_construct(long start, long end, long incr, long chunk, bool *first) {
  Member *m = member();
  Team *t = m->team;
  unsigned c = m->constructs++;
  WorkShare *w = &t->ws[c % WS_SLOTS];
  await_value(&w->free, c, false);
  unsigned expected = c - WS_SLOTS;
  *first = atomic_compare_exchange_strong(&w->owner, &expected, c);
  if (*first) {
    atomic_store_explicit(&w->next, start, memory_order_relaxed);
    w->end = end;
    w->incr = incr;
    w->chunk = chunk > 0 ? chunk : 1;
    atomic_store_explicit(&w->left, t->n, memory_order_relaxed);
    signal_value(&w->ready, c);
  } else {
    await_value(&w->ready, c, true);
  }
  m->current = c;
  return w;
}

static void leave_construct(unsigned c) {
  WorkShare *w = &member()->team->ws[c % WS_SLOTS];
  if (atomic_fetch_sub(&w->left, 1) == 1) signal_value(&w->free, c + WS_SLOTS);
}

static void run_member(Team *t, int id) {
  Member m = {t, id, t->base + (t->loop ? 1 : 0), t->base};
  me = &m;
  t->fn(t->data);
  team_barrier(t);
  me = NULL;
}

static void *worker(void *arg) {
  Team *t = arg;
  int id = atomic_fetch_add(&t->hired, 1) + 1;
  unsigned seen = t->first_word;
  for (;;) {
    await_change(&t->start, seen);
    seen = atomic_load_explicit(&t->start.word, memory_order_acquire);
    run_member(t, id);
  }
  return NULL;
}

static void forget_teams(void) {
  for (int i = 0; i < MAX_TEAMS; ++i) {
    teams[i].created = 0;
    atomic_store(&teams[i].busy, 0);
  }
  me = NULL;
}

static void watch_fork(void) { pthread_atfork(NULL, NULL, forget_teams); }

/* Start the n - 1 workers of a team the caller holds; false if one could not be created
   (the ones started wait for the next region forever: the team is marked unusable). */
static bool create_workers(Team *t, int n) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  t->n = n;
  atomic_store(&t->hired, 0);
  atomic_store(&t->arrived, 0);
  t->first_word = atomic_load(&t->start.word);
  t->base = 0;
  reset_constructs(t);
  bool ok = true;
  for (int k = 1; k < n && ok; ++k) {
    pthread_t thread;
    ok = pthread_create(&thread, NULL, worker, t) == 0 && pthread_detach(thread) == 0;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  t->created = ok ? 1 : -1;
  return ok;
}

static Team *take_team(int n) {
  pthread_once(&fork_once, watch_fork);
  for (int i = 0; i < MAX_TEAMS; ++i) {
    Team *t = &teams[i];
    int idle = 0;
    if (!atomic_compare_exchange_strong(&t->busy, &idle, 1)) continue;
    if (t->created > 0 && t->n == n) return t;
    if (t->created == 0 && create_workers(t, n)) return t;
    atomic_store(&t->busy, 0);
  }
  return NULL;
}

/* A region on the calling thread alone (its own one-thread team). */
static void run_alone(void (*fn)(void *), void *data, long start, long end, long incr, long chunk, bool loop) {
  Member *outer = me;
  Team *solo = aligned_alloc(LINE, sizeof(Team));
  if (!solo) abort();
  memset(solo, 0, sizeof(Team));
  solo->n = 1;
  reset_constructs(solo);
  Member m = {solo, 0, 0, 0};
  me = &m;
  if (loop) {
    bool first;
    enter_construct(start, end, incr, chunk, &first);
  }
  fn(data);
  me = outer;
  free(solo);
}

static void run_region(void (*fn)(void *), void *data, unsigned num_threads, long start, long end, long incr,
                       long chunk, bool loop) {
  int n = num_threads ? (int)num_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (n > MAX_THREADS) n = MAX_THREADS;
  Team *t = n > 1 && !me ? take_team(n) : NULL;
  if (!t) {
    run_alone(fn, data, start, end, incr, chunk, loop);
    return;
  }
  t->fn = fn;
  t->data = data;
  t->loop = loop;
  Member m = {t, 0, t->base, 0};
  me = &m;
  if (loop) {
    bool first;
    enter_construct(start, end, incr, chunk, &first); /* set up before the workers see it */
  }
  signal_change(&t->start);
  fn(data);
  team_barrier(t);
  t->base = m.constructs; /* every thread met as many: the slots are ready for the next ones */
  me = NULL;
  atomic_store(&t->busy, 0);
}

void einjit_team_parallel(void (*fn)(void *), void *data, unsigned num_threads) {
  run_region(fn, data, num_threads, 0, 0, 1, 1, false);
}

void einjit_team_parallel_loop(void (*fn)(void *), void *data, unsigned num_threads, long start, long end, long incr,
                               long chunk) {
  run_region(fn, data, num_threads, start, end, incr, chunk, true);
}

bool einjit_team_loop_next(long *istart, long *iend) {
  Member *m = member();
  WorkShare *w = &m->team->ws[m->current % WS_SLOTS];
  long step = w->chunk * w->incr;
  long i = atomic_fetch_add_explicit(&w->next, step, memory_order_relaxed);
  if (w->incr > 0 ? i >= w->end : i <= w->end) return false;
  long e = i + step;
  *istart = i;
  *iend = w->incr > 0 ? (e < w->end ? e : w->end) : (e > w->end ? e : w->end);
  return true;
}

bool einjit_team_loop_start(long start, long end, long incr, long chunk, long *istart, long *iend) {
  bool first;
  enter_construct(start, end, incr, chunk, &first);
  return einjit_team_loop_next(istart, iend);
}

void einjit_team_loop_end(bool wait) {
  leave_construct(member()->current);
  if (wait) team_barrier(member()->team);
}

bool einjit_team_single_start(void) {
  bool first;
  enter_construct(0, 0, 1, 1, &first);
  leave_construct(member()->current);
  return first;
}

void einjit_team_barrier(void) { team_barrier(member()->team); }

void einjit_team_critical(bool enter) {
  if (enter)
    pthread_mutex_lock(&critical);
  else
    pthread_mutex_unlock(&critical);
}

int einjit_team_thread_num(void) { return me ? me->id : 0; }

int einjit_team_num_threads(void) { return me ? me->team->n : 1; }
