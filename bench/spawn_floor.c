// The floor a launcher is measured against (bench/launcher_bench.py): what starting workers costs
// with nothing else done, in C, with posix_spawn.
//
//   spawn_floor launch N PROGRAM [ARG...]
//       posix_spawn N copies of PROGRAM, wait for all of them; exit 0 when every one exited 0.
//   spawn_floor restart N PROGRAM [ARG...]
//       restarts with nothing else done: N copies with TORCHELASTIC_RESTART_COUNT=0 and RANK=i;
//       when the first one exits, and it failed, SIGKILL the others and wait for them, then N
//       copies with TORCHELASTIC_RESTART_COUNT=1, and so on until an attempt's first exit is a
//       success; then wait for the rest. The workers print their own timestamps (the bench reads
//       "crash A" -> last "start A+1" from their output, as it does for launchers).
//   spawn_floor time N PROGRAM [ARG...]
//       the timer: runs PROGRAM N times, one after the other, as a shell runs a command
//       (posix_spawn, stdin and output on /dev/null, then wait), and prints each run's wall time
//       in nanoseconds and its peak RSS in KiB, one run a line; exit 1 when a run did not exit 0.
#define _GNU_SOURCE
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

enum { kMaxWorkers = 4096, kMaxEnv = 4096 };

static pid_t spawn_one(char** argv, char** env) {
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], NULL, NULL, argv, env);
  if (rc != 0) {
    fprintf(stderr, "spawn_floor: posix_spawn %s: %s\n", argv[0], strerror(rc));
    exit(1);
  }
  return pid;
}

// environ plus TORCHELASTIC_RESTART_COUNT and RANK; `slots` holds the two strings.
static char** worker_env(int attempt, int rank, char slots[2][64]) {
  static char* env[kMaxEnv + 3];
  int n = 0;
  for (char** e = environ; *e && n < kMaxEnv; ++e) {
    if (strncmp(*e, "TORCHELASTIC_RESTART_COUNT=", 27) != 0 && strncmp(*e, "RANK=", 5) != 0) env[n++] = *e;
  }
  snprintf(slots[0], 64, "TORCHELASTIC_RESTART_COUNT=%d", attempt);
  snprintf(slots[1], 64, "RANK=%d", rank);
  env[n++] = slots[0];
  env[n++] = slots[1];
  env[n] = NULL;
  return env;
}

static int wait_all(int n) {
  int failed = 0, status;
  for (int i = 0; i < n; ++i) {
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
  }
  return failed;
}

static int launch(int n, char** argv) {
  for (int i = 0; i < n; ++i) spawn_one(argv, environ);
  return wait_all(n);
}

static int restart(int n, char** argv) {
  static pid_t pids[kMaxWorkers];
  char slots[2][64];
  for (int attempt = 0;; ++attempt) {
    for (int i = 0; i < n; ++i) pids[i] = spawn_one(argv, worker_env(attempt, i, slots));
    int status;
    pid_t first = wait(&status);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return wait_all(n - 1);
    for (int i = 0; i < n; ++i) {  // a crash
      if (pids[i] != first) kill(pids[i], SIGKILL);
    }
    for (int i = 1; i < n; ++i) wait(&status);
  }
}

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int time_runs(int n, char** argv) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    const long long t0 = now_ns();
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    if (rc != 0) {
      fprintf(stderr, "spawn_floor: posix_spawn %s: %s\n", argv[0], strerror(rc));
      return 1;
    }
    int status;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    if (wait4(pid, &status, 0, &ru) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) failed = 1;
    const long long wall = now_ns() - t0;
    printf("%lld %ld\n", wall, ru.ru_maxrss);
  }
  posix_spawn_file_actions_destroy(&fa);
  return failed;
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: spawn_floor launch|restart|time N PROGRAM [ARG...]\n");
    return 2;
  }
  int n = atoi(argv[2]);
  if (n < 1 || (n > kMaxWorkers && strcmp(argv[1], "time") != 0)) {
    fprintf(stderr, "spawn_floor: N must be 1..%d\n", kMaxWorkers);
    return 2;
  }
  if (strcmp(argv[1], "launch") == 0) return launch(n, argv + 3);
  if (strcmp(argv[1], "restart") == 0) return restart(n, argv + 3);
  if (strcmp(argv[1], "time") == 0) return time_runs(n, argv + 3);
  fprintf(stderr, "spawn_floor: unknown mode '%s'\n", argv[1]);
  return 2;
}
