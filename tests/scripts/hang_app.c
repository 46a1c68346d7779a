// cuwarden tests: a program that hangs on purpose, for tests/deadline.sh's self-test
// (check_deadline.sh). Its main thread, a second thread, a child and an orphaned grandchild
// each block forever in a function named after where it is; their pids go to argv[1].
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) static void block_forever(void) {
  for (;;) pause();
}
__attribute__((noinline, used)) void cuwt_hang_in_thread(void) { block_forever(); }
__attribute__((noinline, used)) void cuwt_hang_in_child(void) { block_forever(); }
__attribute__((noinline, used)) void cuwt_hang_orphan(void) { block_forever(); }
__attribute__((noinline, used)) void cuwt_hang_in_main(void) { block_forever(); }

static void* thread_main(void* arg) {
  (void)arg;
  cuwt_hang_in_thread();
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s PIDFILE\n", argv[0]);
    return 64;
  }
  FILE* f = fopen(argv[1], "w");
  if (!f) return 1;
  fprintf(f, "%d\n", (int)getpid());
  fflush(f);
  // An orphan: its parent exits at once, so only the process group still ties it to the test.
  int link[2];
  if (pipe(link) != 0) return 1;
  const pid_t middle = fork();
  if (middle == 0) {
    const pid_t orphan = fork();
    if (orphan == 0) {
      close(link[0]);
      close(link[1]);
      cuwt_hang_orphan();
    }
    if (write(link[1], &orphan, sizeof orphan) != sizeof orphan) _exit(1);
    _exit(0);
  }
  pid_t orphan = -1;
  close(link[1]);
  if (read(link[0], &orphan, sizeof orphan) != sizeof orphan) return 1;
  waitpid(middle, NULL, 0);
  fprintf(f, "%d\n", (int)orphan);
  const pid_t child = fork();
  if (child == 0) cuwt_hang_in_child();
  fprintf(f, "%d\n", (int)child);
  fclose(f);
  pthread_t t;
  if (pthread_create(&t, NULL, thread_main, NULL) != 0) return 1;
  printf("hanging\n");
  fflush(stdout);
  cuwt_hang_in_main();
  return 0;
}
