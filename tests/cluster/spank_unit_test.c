/* cuwarden tests: the SPANK plugin's parsing and what it sets in a task, without slurmd. The
 * plugin's source is compiled in here, against Slurm's own spank.h, with the few functions
 * of Slurm it calls played by this file (a task environment in a table). Exit 0 when every
 * check holds; each failure is one line on stderr. */
#include "../../cluster/slurm/cuwarden_spank.c"

#include <dirent.h>
#include <stdarg.h>

static int failures;
#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

/* ---- Slurm, as far as the plugin uses it ------------------------------------------------ */

#define ENV_MAX 32
static char env_name[ENV_MAX][64], env_value[ENV_MAX][4096];
static int env_count;

static int env_find(const char *name) {
  for (int i = 0; i < env_count; ++i)
    if (!strcmp(env_name[i], name)) return i;
  return -1;
}
static void env_set(const char *name, const char *value) {
  int i = env_find(name);
  if (i < 0) i = env_count++;
  snprintf(env_name[i], sizeof env_name[i], "%s", name);
  snprintf(env_value[i], sizeof env_value[i], "%s", value);
}
static const char *env_get(const char *name) {
  const int i = env_find(name);
  return i < 0 ? NULL : env_value[i];
}

spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len) {
  (void)sp;
  const char *v = env_get(var);
  if (!v) return ESPANK_ENV_NOEXIST;
  if ((int)strlen(v) >= len) return ESPANK_NOSPACE;
  snprintf(buf, (size_t)len, "%s", v);
  return ESPANK_SUCCESS;
}
spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite) {
  (void)sp;
  if (!overwrite && env_get(var)) return ESPANK_ENV_EXISTS;
  env_set(var, val);
  return ESPANK_SUCCESS;
}
spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...) {
  (void)sp;
  va_list ap;
  va_start(ap, item);
  spank_err_t r = ESPANK_SUCCESS;
  if (item == S_JOB_ID) *va_arg(ap, uint32_t *) = 77;
  else r = ESPANK_BAD_ARG;
  va_end(ap);
  return r;
}
spank_err_t spank_option_register(spank_t sp, struct spank_option *opt) {
  (void)sp;
  (void)opt;
  return ESPANK_SUCCESS;
}
spank_context_t spank_context(void) { return S_CTX_REMOTE; }
int spank_remote(spank_t sp) {
  (void)sp;
  return 1;
}
const char *spank_strerror(spank_err_t err) {
  (void)err;
  return "error";
}
void slurm_error(const char *format, ...) {
  va_list ap;
  va_start(ap, format);
  fputs("  (plugin) ", stderr);
  vfprintf(stderr, format, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---- the checks ------------------------------------------------------------------------ */

static int arguments(const char *a, const char *b) {
  char *av[2] = {(char *)a, (char *)b};
  max_limit = max_job_limit = shard_size = 0;
  def_limit[0] = def_job_limit[0] = 0;
  qos_count = 0;
  return read_arguments(b ? 2 : 1, av);
}

static void sizes_under_one_mib_are_refused(void) {
  char out[SIZE_TEXT];
  CHECK(take_size("--gpu-mem-limit", "0", out) == -1);
  CHECK(take_size("--gpu-mem-limit", "1", out) == -1);
  CHECK(take_size("--gpu-mem-limit", "5000", out) == -1);
  CHECK(take_size("--gpu-mem-limit", "1023K", out) == -1);
  CHECK(take_size("--gpu-mem-limit", "1M", out) == 0);
  CHECK(take_size("--gpu-mem-limit", "8G", out) == 0 && !strcmp(out, "8G"));
  CHECK(take_size("--gpu-mem-limit", "75%", out) == 0);
  CHECK(arguments("max=0", NULL) == -1);
  CHECK(arguments("max=5000", NULL) == -1);
  CHECK(arguments("job_max=1K", NULL) == -1);
  CHECK(arguments("default=0", NULL) == -1);
  CHECK(arguments("max=80G", NULL) == 0 && max_limit == 80ULL << 30);
  CHECK(arguments("run_dir=relative", NULL) == -1);
}

static void the_library_is_matched_entry_by_entry(void) {
  CHECK(preload_has("/l/libcuwarden.so", "/l/libcuwarden.so"));
  CHECK(preload_has("/a.so:/l/libcuwarden.so", "/l/libcuwarden.so"));
  CHECK(preload_has("/a.so /l/libcuwarden.so /b.so", "/l/libcuwarden.so"));
  CHECK(!preload_has("/l/libcuwarden.so.evil", "/l/libcuwarden.so"));
  CHECK(!preload_has("/x/l/libcuwarden.so", "/l/libcuwarden.so"));
  CHECK(!preload_has("", "/l/libcuwarden.so"));
}

static void the_task_environment_cannot_turn_enforcement_off(void) {
  CHECK(arguments("lib=/l/libcuwarden.so", "max=8G") == 0);
  env_count = 0;
  opt_limit[0] = opt_job_limit[0] = 0;
  env_set("CUWARDEN_ON_ERROR", "open");
  env_set("CUWARDEN_CONFIG", "/home/u/mine.conf");
  env_set("CUWARDEN_RUN_DIR", "/tmp/u");
  env_set("CUWARDEN_LIMIT", "0");
  env_set("LD_PRELOAD", "/l/libcuwarden.so.evil");
  CHECK(slurm_spank_task_init(NULL, 0, NULL) == 0);
  CHECK(env_get("CUWARDEN_ON_ERROR") && !strcmp(env_get("CUWARDEN_ON_ERROR"), "fail"));
  CHECK(env_get("CUWARDEN_CONFIG") && !strcmp(env_get("CUWARDEN_CONFIG"), "off"));
  CHECK(env_get("CUWARDEN_RUN_DIR") && !strcmp(env_get("CUWARDEN_RUN_DIR"), DEFAULT_RUN_DIR));
  CHECK(env_get("CUWARDEN_LIMIT") && !strcmp(env_get("CUWARDEN_LIMIT"), "8589934592"));
  CHECK(env_get("LD_PRELOAD") && !strcmp(env_get("LD_PRELOAD"), "/l/libcuwarden.so:/l/libcuwarden.so.evil"));
  CHECK(env_get("CUWARDEN_JOB") && !strcmp(env_get("CUWARDEN_JOB"), "slurm-77"));

  /* run_dir= wins over the environment too, and a preload already there is not doubled. */
  CHECK(arguments("lib=/l/libcuwarden.so", "run_dir=/run/cw") == 0);
  env_set("LD_PRELOAD", "/a.so:/l/libcuwarden.so");
  CHECK(slurm_spank_task_init(NULL, 0, NULL) == 0);
  CHECK(!strcmp(env_get("CUWARDEN_RUN_DIR"), "/run/cw"));
  CHECK(!strcmp(env_get("LD_PRELOAD"), "/a.so:/l/libcuwarden.so"));
}

/* The priority a task gets from its job's QOS: the table's, or the task's own when lower. */
static const char *task_priority(const char *qos, const char *own) {
  env_count = 0;
  opt_limit[0] = opt_job_limit[0] = 0;
  if (qos) env_set("SLURM_JOB_QOS", qos);
  if (own) env_set("CUWARDEN_PRIORITY", own);
  if (slurm_spank_task_init(NULL, 0, NULL) != 0) return "(task_init failed)";
  return env_get("CUWARDEN_PRIORITY");
}

static void the_job_qos_sets_the_priority(void) {
  CHECK(arguments("qos_priority=normal:0,high:10,scavenger:-10", NULL) == 0 && qos_count == 3);
  const char *p = task_priority("high", NULL);
  CHECK(p && !strcmp(p, "10"));
  p = task_priority("scavenger", NULL);
  CHECK(p && !strcmp(p, "-10"));
  p = task_priority("normal", NULL);
  CHECK(p && !strcmp(p, "0"));
  /* The task may ask for less, never for more; a value that is not a priority is replaced. */
  p = task_priority("high", "3");
  CHECK(p && !strcmp(p, "3"));
  p = task_priority("normal", "500");
  CHECK(p && !strcmp(p, "0"));
  p = task_priority("high", "ten");
  CHECK(p && !strcmp(p, "10"));
  p = task_priority("high", "5000");
  CHECK(p && !strcmp(p, "10"));
  /* A QOS the table does not name, or none, leaves the environment as it is. */
  CHECK(task_priority("debug", NULL) == NULL);
  p = task_priority("debug", "7");
  CHECK(p && !strcmp(p, "7"));
  CHECK(task_priority(NULL, NULL) == NULL);
  /* Without the table, nothing is set whatever the QOS. */
  CHECK(arguments("max=8G", NULL) == 0);
  CHECK(task_priority("high", NULL) == NULL);

  /* What the table may say. */
  CHECK(arguments("qos_priority=high:1000,low:-1000", NULL) == 0 && qos_count == 2);
  CHECK(arguments("qos_priority=high:1001", NULL) == -1);
  CHECK(arguments("qos_priority=high:-1001", NULL) == -1);
  CHECK(arguments("qos_priority=high", NULL) == -1);
  CHECK(arguments("qos_priority=high:", NULL) == -1);
  CHECK(arguments("qos_priority=:5", NULL) == -1);
  CHECK(arguments("qos_priority=high:5x", NULL) == -1);
  CHECK(arguments("qos_priority=high:5,,low:1", NULL) == -1);
  CHECK(arguments("qos_priority=high:5,high:6", NULL) == -1);
  CHECK(arguments("qos_priority=", NULL) == -1);
}

/* As root, a fresh directory from `dir` (a mkdtemp template): 1, or 0 with the reason said
 * (not root: `what` needs it, as slurmd runs the plugin as root). */
static int root_scratch_dir(char *dir, const char *what) {
  if (geteuid() != 0) {
    printf("%s needs root (the plugin acts on it as root); skipped\n", what);
    return 0;
  }
  if (!mkdtemp(dir)) {
    CHECK(!"mkdtemp");
    return 0;
  }
  return 1;
}

/* An empty file at `path`. */
static void touch(const char *path) {
  const int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
}

/* The job's epilog: Slurm runs it with no slurm_spank_init before it, so it reads run_dir=
 * from its own arguments and removes the job's ceiling file there (job 77 here). It acts only
 * as root, as slurmd runs it. */
static void the_epilog_removes_the_ceiling_file_in_its_own_run_dir(void) {
  char dir[] = "/tmp/cuwt-spank-XXXXXX", ceilings[64], file[96], arg[64];
  if (!root_scratch_dir(dir, "the job epilog's check")) return;
  snprintf(ceilings, sizeof ceilings, "%s/ceilings", dir);
  snprintf(file, sizeof file, "%s/slurm-77", ceilings);
  snprintf(arg, sizeof arg, "run_dir=%s", dir);
  CHECK(mkdir(ceilings, 0755) == 0);
  touch(file);
  snprintf(run_dir, sizeof run_dir, "%s", DEFAULT_RUN_DIR); /* a fresh epilog process's */
  char *av[2] = {"lib=/l/libcuwarden.so", arg};
  CHECK(slurm_spank_job_epilog(NULL, 2, av) == 0);
  CHECK(access(file, F_OK) != 0);
  unlink(file);
  rmdir(ceilings);
  rmdir(dir);
}

/* Another user's entries where the ceilings directory belongs (the run directory lets every
 * user make entries): a symlink is never followed by the epilog's unlink, and a directory or
 * symlink of someone else's is moved aside before the ceiling file is written into root's
 * own. As root, as slurmd runs the plugin. */
static int count_entries_starting(const char *dir, const char *prefix) {
  int n = 0;
  DIR *d = opendir(dir);
  if (!d) return -1;
  for (struct dirent *e; (e = readdir(d));)
    if (!strncmp(e->d_name, prefix, strlen(prefix))) ++n;
  closedir(d);
  return n;
}

static void another_users_ceilings_entry_is_never_followed_and_is_moved_aside(void) {
  char dir[] = "/tmp/cuwt-spank-XXXXXX", ceilings[64], target[64], victim[96], arg[64], file[96];
  if (!root_scratch_dir(dir, "the ceilings directory's check")) return;
  snprintf(ceilings, sizeof ceilings, "%s/ceilings", dir);
  snprintf(target, sizeof target, "%s/elsewhere", dir);
  snprintf(victim, sizeof victim, "%s/slurm-77", target);
  snprintf(file, sizeof file, "%s/slurm-77", ceilings);
  snprintf(arg, sizeof arg, "run_dir=%s", dir);
  CHECK(mkdir(target, 0755) == 0);
  touch(victim);
  CHECK(symlink(target, ceilings) == 0);

  /* The epilog: the file behind the symlink stays. */
  snprintf(run_dir, sizeof run_dir, "%s", DEFAULT_RUN_DIR);
  char *av[1] = {arg};
  CHECK(slurm_spank_job_epilog(NULL, 1, av) == 0);
  CHECK(access(victim, F_OK) == 0);

  /* The ceiling file: the symlink goes aside, root's directory holds the file. */
  snprintf(task_limit, sizeof task_limit, "%s", "8G");
  task_job_limit[0] = 0;
  write_ceiling(77);
  struct stat st;
  CHECK(lstat(ceilings, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0 && !(st.st_mode & 022));
  char text[64] = "";
  const int fd = open(file, O_RDONLY | O_CLOEXEC);
  CHECK(fd >= 0);
  if (fd >= 0) {
    CHECK(read(fd, text, sizeof text - 1) > 0);
    close(fd);
  }
  CHECK(!strcmp(text, "CUWARDEN_LIMIT=8G\n"));
  CHECK(access(victim, F_OK) == 0);
  CHECK(count_entries_starting(dir, "ceilings.not-root-") == 1);

  /* Another user's directory in its place: moved aside too, the next job's file is root's. */
  unlink(file);
  char moved[96];
  snprintf(moved, sizeof moved, "%s/ceilings.squatter", dir);
  CHECK(rename(ceilings, moved) == 0);
  CHECK(mkdir(ceilings, 0777) == 0);
  CHECK(chown(ceilings, 65534, 65534) == 0);
  write_ceiling(78);
  CHECK(lstat(ceilings, &st) == 0 && st.st_uid == 0);
  snprintf(file, sizeof file, "%s/slurm-78", ceilings);
  CHECK(access(file, F_OK) == 0);
  CHECK(count_entries_starting(dir, "ceilings.not-root-") == 2);
  task_limit[0] = 0;

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
}

int main(void) {
  sizes_under_one_mib_are_refused();
  the_library_is_matched_entry_by_entry();
  the_task_environment_cannot_turn_enforcement_off();
  the_job_qos_sets_the_priority();
  the_epilog_removes_the_ceiling_file_in_its_own_run_dir();
  another_users_ceilings_entry_is_never_followed_and_is_moved_aside();
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("all checks passed\n");
  return failures ? 1 : 0;
}
