/* cuwarden SPANK plugin: --gpu-mem-limit=SIZE and --gpu-mem-job-limit=SIZE for srun, sbatch
 * and salloc. Each task of a job gets the interposer preloaded, its per-process cap
 * (CUWARDEN_LIMIT), and the job name slurm-<jobid> (CUWARDEN_JOB) with the job's cap
 * (CUWARDEN_JOB_LIMIT), so that all tasks of one job on a node share one cap per GPU.
 *
 * plugstack.conf (arguments are optional; sizes as the interposer reads them):
 *   required /usr/lib/x86_64-linux-gnu/cuwarden/cuwarden_spank.so \
 *       lib=/usr/lib/x86_64-linux-gnu/cuwarden/libcuwarden.so default=16G max=80G \
 *       job_default=80G job_max=320G shard_size=10G run_dir=/dev/shm/cuwarden \
 *       qos_priority=normal:0,high:10,scavenger:-10
 *
 * A maximum without a default is also the default: a job that asks for nothing is held to
 * the site's maximum, not left uncapped. shard_size is the GPU memory of one gres/shard: a
 * task that sees SLURM_SHARDS_ON_NODE=N gets a job cap of at most N * shard_size per GPU.
 *
 * Sizes are checked here only as far as a site maximum needs (bytes, K M G T, KiB MiB GiB
 * TiB, kB MB GB TB), and none under 1 MiB is taken (the interposer refuses those); the
 * interposer checks every value again and names a bad one at the task's first CUDA call. A
 * share ("75%") is passed on when the site sets no maximum.
 *
 * qos_priority maps the job's QOS (SLURM_JOB_QOS) to the priority its tasks ask the daemon
 * for (CUWARDEN_PRIORITY, an integer from -1000 to 1000: who is suspended to make room on a
 * full GPU). A task may ask for less in its environment, never more; a QOS the table does not
 * name leaves the environment as it is. What a process gets is still bounded by the daemon's
 * policy (max_priority), so a QOS named falsely in a task's environment gains nothing the
 * user could not ask for with CUWARDEN_PRIORITY.
 *
 * What decides enforcement is the plugin's, never the task environment's: every task gets
 * CUWARDEN_ON_ERROR=fail (a bad value stops the task rather than run it uncapped),
 * CUWARDEN_CONFIG=off (no per-user file of settings) and CUWARDEN_RUN_DIR (run_dir=, else
 * the interposer's default). A user can still unset LD_PRELOAD in their own program; only a
 * node-wide /etc/ld.so.preload and the daemon's policy are beyond a job's reach.
 *
 * As root, before each task starts (task_init_privileged), the plugin makes the job owner's
 * job directory <run dir>/jobs/<uid>/ (mode 0700, the user's), so that no other user can
 * take its name first (cuw/job.hpp in the source), and writes the task's caps to the job's
 * ceiling file <run dir>/ceilings/slurm-<jobid> (root's, 0644, in root's 0755 ceilings/;
 * cuw/site_cap.hpp): the task's environment can be changed in a child process, that file
 * cannot, and both the interposer and the daemon hold the job's processes to it. The job's
 * epilog (job_epilog, as root, once the job has ended on the node) removes it. */
#define _GNU_SOURCE /* renameat2 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(cuwarden, 1)

#define SIZE_TEXT 64
/* The interposer's smallest cap, and its default run directory (common/include/cuw/options.hpp). */
#define MIN_SIZE (1ULL << 20)
#define DEFAULT_RUN_DIR "/dev/shm/cuwarden"

/* What the plugin's arguments and the user's options say; one copy per process (srun,
 * sbatch, slurmstepd). */
static char opt_limit[SIZE_TEXT], opt_job_limit[SIZE_TEXT];
static char def_limit[SIZE_TEXT], def_job_limit[SIZE_TEXT];
static uint64_t max_limit, max_job_limit; /* bytes; 0 = none */
static uint64_t shard_size;                /* bytes of GPU memory per gres/shard; 0 = not used */
static char lib[1024] = "/usr/lib/x86_64-linux-gnu/cuwarden/libcuwarden.so";
static char run_dir[1024] = DEFAULT_RUN_DIR;

/* qos_priority=: the job's QOS name to the priority its tasks get (the daemon's range). */
#define MAX_QOS 32
#define QOS_NAME 64
#define MIN_PRIORITY (-1000)
#define MAX_PRIORITY 1000
static struct {
  char name[QOS_NAME];
  int priority;
} qos_table[MAX_QOS];
static int qos_count;

/* Bytes of a size, or UINT64_MAX for a share or anything else that is not a size. */
static uint64_t size_bytes(const char *s) {
  static const struct {
    const char *unit;
    uint64_t mult;
  } units[] = {{"", 1},          {"B", 1},          {"K", 1ULL << 10},  {"M", 1ULL << 20},  {"G", 1ULL << 30},
               {"T", 1ULL << 40}, {"KiB", 1ULL << 10}, {"MiB", 1ULL << 20}, {"GiB", 1ULL << 30}, {"TiB", 1ULL << 40},
               {"kB", 1000ULL},   {"MB", 1000000ULL}, {"GB", 1000000000ULL}, {"TB", 1000000000000ULL}};
  char *end = NULL;
  if (!isdigit((unsigned char)*s)) return UINT64_MAX;
  errno = 0;
  const unsigned long long n = strtoull(s, &end, 10);
  if (errno) return UINT64_MAX;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; ++i)
    if (strcmp(end, units[i].unit) == 0) {
      if (n > UINT64_MAX / units[i].mult) return UINT64_MAX;
      return n * units[i].mult;
    }
  return UINT64_MAX;
}

/* Copies `value` into `dst` (SIZE_TEXT bytes) when it is a plausible size of at least
 * MIN_SIZE (or a share, "75%"); else says why. */
static int take_size(const char *what, const char *value, char *dst) {
  if (!value || !*value || strlen(value) >= SIZE_TEXT || strchr(value, ',') || strchr(value, '=')) {
    slurm_error("cuwarden: %s='%s': expected a size such as 8G or 512MiB", what, value ? value : "");
    return -1;
  }
  const uint64_t b = size_bytes(value);
  if (b != UINT64_MAX && b < MIN_SIZE) {
    slurm_error("cuwarden: %s='%s': a cap under 1 MiB is not a cap; give a size such as 8G or 512MiB", what, value);
    return -1;
  }
  snprintf(dst, SIZE_TEXT, "%s", value);
  return 0;
}

static int on_limit(int val, const char *optarg, int remote) {
  (void)val;
  (void)remote;
  return take_size("--gpu-mem-limit", optarg, opt_limit);
}

static int on_job_limit(int val, const char *optarg, int remote) {
  (void)val;
  (void)remote;
  return take_size("--gpu-mem-job-limit", optarg, opt_job_limit);
}

static struct spank_option options[] = {
    {"gpu-mem-limit", "SIZE", "GPU memory cap of each process, per GPU (cuwarden): 8G, 512MiB", 1, 0, on_limit},
    {"gpu-mem-job-limit", "SIZE", "GPU memory cap of the whole job on each GPU of a node (cuwarden): 32G", 1, 0,
     on_job_limit},
    SPANK_OPTIONS_TABLE_END};

/* An integer in MIN_PRIORITY..MAX_PRIORITY from all of `s`, into *out; else -1. */
static int parse_priority(const char *s, int *out) {
  char *end = NULL;
  if (!*s || isspace((unsigned char)*s)) return -1;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (errno || *end || v < MIN_PRIORITY || v > MAX_PRIORITY) return -1;
  *out = (int)v;
  return 0;
}

/* qos_priority=NAME:PRIORITY[,NAME:PRIORITY...] into qos_table; -1 after saying why. */
static int read_qos_table(const char *v) {
  qos_count = 0;
  for (const char *p = v; *p;) {
    const char *end = strchr(p, ',');
    const size_t len = end ? (size_t)(end - p) : strlen(p);
    char item[QOS_NAME + 16];
    const char *colon = memchr(p, ':', len);
    int priority = 0;
    if (len >= sizeof item || !colon || colon == p || (size_t)(colon - p) >= QOS_NAME) {
      slurm_error("cuwarden: plugstack.conf: qos_priority: '%.*s': expected QOS:PRIORITY, such as high:10", (int)len, p);
      return -1;
    }
    snprintf(item, sizeof item, "%.*s", (int)len, p);
    const size_t nlen = (size_t)(colon - p);
    if (parse_priority(item + nlen + 1, &priority)) {
      slurm_error("cuwarden: plugstack.conf: qos_priority: '%s': the priority must be an integer from %d to %d", item,
                  MIN_PRIORITY, MAX_PRIORITY);
      return -1;
    }
    item[nlen] = 0;
    for (int i = 0; i < qos_count; ++i)
      if (!strcmp(qos_table[i].name, item)) {
        slurm_error("cuwarden: plugstack.conf: qos_priority: QOS '%s' is given twice", item);
        return -1;
      }
    if (qos_count == MAX_QOS) {
      slurm_error("cuwarden: plugstack.conf: qos_priority: more than %d QOS", MAX_QOS);
      return -1;
    }
    memcpy(qos_table[qos_count].name, item, nlen + 1); /* nlen < QOS_NAME, checked above */
    qos_table[qos_count++].priority = priority;
    p = end ? end + 1 : p + len;
  }
  if (!qos_count) {
    slurm_error("cuwarden: plugstack.conf: qos_priority= is empty (expected QOS:PRIORITY, such as high:10)");
    return -1;
  }
  return 0;
}

/* Reads plugstack.conf's arguments: lib= default= max= job_default= job_max= shard_size=
 * run_dir= qos_priority=. */
static int read_arguments(int ac, char **av) {
  for (int i = 0; i < ac; ++i) {
    const char *a = av[i];
    const char *eq = strchr(a, '=');
    const char *v = eq ? eq + 1 : "";
    const size_t klen = eq ? (size_t)(eq - a) : strlen(a);
    uint64_t *max = NULL;
    if (klen == 3 && !strncmp(a, "lib", 3))
      snprintf(lib, sizeof lib, "%s", v);
    else if (klen == 7 && !strncmp(a, "run_dir", 7)) {
      if (v[0] != '/') {
        slurm_error("cuwarden: plugstack.conf: run_dir='%s': expected an absolute path", v);
        return -1;
      }
      snprintf(run_dir, sizeof run_dir, "%s", v);
    } else if (klen == 12 && !strncmp(a, "qos_priority", 12)) {
      if (read_qos_table(v)) return -1;
    }
    else if (klen == 7 && !strncmp(a, "default", 7)) {
      if (take_size("plugstack.conf default", v, def_limit)) return -1;
    } else if (klen == 11 && !strncmp(a, "job_default", 11)) {
      if (take_size("plugstack.conf job_default", v, def_job_limit)) return -1;
    } else if (klen == 3 && !strncmp(a, "max", 3))
      max = &max_limit;
    else if (klen == 7 && !strncmp(a, "job_max", 7))
      max = &max_job_limit;
    else if (klen == 10 && !strncmp(a, "shard_size", 10))
      max = &shard_size;
    else {
      slurm_error("cuwarden: plugstack.conf: unknown argument '%s' (lib= default= max= job_default= job_max= "
                  "shard_size= run_dir= qos_priority=)",
                  a);
      return -1;
    }
    if (max && ((*max = size_bytes(v)) == UINT64_MAX || *max < MIN_SIZE)) {
      slurm_error("cuwarden: plugstack.conf: '%s': expected a size of at least 1 MiB, such as 80G", a);
      return -1;
    }
  }
  /* A maximum with no default is the default (see the top of this file). */
  if (max_limit && !*def_limit) snprintf(def_limit, sizeof def_limit, "%llu", (unsigned long long)max_limit);
  if (max_job_limit && !*def_job_limit)
    snprintf(def_job_limit, sizeof def_job_limit, "%llu", (unsigned long long)max_job_limit);
  return 0;
}

/* The cap to give: the user's, else the site's default; past the site's maximum it is
 * refused where the user types the command (`clamp` = 0: srun, sbatch, salloc). Where the
 * task starts (`clamp` = 1) the job was accepted against the maximum of its submission: a
 * maximum lowered since then holds the task to the new one and says so, rather than failing
 * a job that waited in the queue. Writes the cap to `out` (SIZE_TEXT bytes; "" for none);
 * -1 after saying why it refused. */
static int effective(const char *asked, const char *dflt, uint64_t max, const char *option, int clamp, char *out) {
  const char *v = *asked ? asked : dflt;
  const uint64_t b = *v ? size_bytes(v) : UINT64_MAX;
  if (*v && b < MIN_SIZE) {
    /* From the task's environment (options are checked when given): the site's default
     * instead, else its maximum, else nothing, which the interposer reads as no cap. */
    slurm_error("cuwarden: %s=%s: a cap under 1 MiB is not a cap; %s", option, v,
                *dflt ? "the site's default applies" : max ? "the site's maximum applies" : "ignored");
    v = *dflt ? dflt : "";
    if (!*dflt && max) {
      snprintf(out, SIZE_TEXT, "%llu", (unsigned long long)max);
      return 0;
    }
    return effective("", v, max, option, clamp, out);
  }
  snprintf(out, SIZE_TEXT, "%s", v);
  if (!*v || !max) return 0;
  if (b != UINT64_MAX && b <= max) return 0;
  if (clamp) {
    slurm_error("cuwarden: %s=%s is more than this site's maximum of %llu bytes; the task is capped at the maximum",
                option, v, (unsigned long long)max);
    snprintf(out, SIZE_TEXT, "%llu", (unsigned long long)max);
    return 0;
  }
  if (b == UINT64_MAX)
    slurm_error("cuwarden: %s=%s: this site caps it at %llu bytes: give a size (bytes, K M G T)", option, v,
                (unsigned long long)max);
  else
    slurm_error("cuwarden: %s=%s is more than this site's maximum of %llu bytes", option, v, (unsigned long long)max);
  return -1;
}

/* The job cap of a task that holds gres/shards: at most SLURM_SHARDS_ON_NODE * shard_size
 * bytes per GPU (all of them, in case the shards span GPUs). Lowers `job_limit` (SIZE_TEXT
 * bytes) to that, or sets it when it is empty or a share; leaves it alone without shards. */
static void shard_cap(spank_t sp, char *job_limit) {
  char text[32] = "";
  if (!shard_size || spank_getenv(sp, "SLURM_SHARDS_ON_NODE", text, sizeof text) != ESPANK_SUCCESS) return;
  char *end = NULL;
  errno = 0;
  const unsigned long long shards = strtoull(text, &end, 10);
  if (errno || end == text || *end || shards == 0) return;
  const uint64_t cap = shards > UINT64_MAX / shard_size ? UINT64_MAX : shards * shard_size;
  const uint64_t asked = *job_limit ? size_bytes(job_limit) : UINT64_MAX;
  if (asked > cap) snprintf(job_limit, SIZE_TEXT, "%llu", (unsigned long long)cap);
}

/* CUWARDEN_PRIORITY of a task from its job's QOS (qos_priority=): the QOS's priority, or the
 * task's own when that is lower; nothing when the table does not name the QOS. -1 when the
 * environment cannot be set. */
static int qos_priority(spank_t sp) {
  char qos[QOS_NAME] = "", own[32] = "";
  if (!qos_count || spank_getenv(sp, "SLURM_JOB_QOS", qos, sizeof qos) != ESPANK_SUCCESS) return 0;
  for (int i = 0; i < qos_count; ++i) {
    if (strcmp(qos_table[i].name, qos)) continue;
    int priority = qos_table[i].priority, asked = 0;
    if (spank_getenv(sp, "CUWARDEN_PRIORITY", own, sizeof own) == ESPANK_SUCCESS && *own) {
      if (parse_priority(own, &asked) == 0) {
        if (asked < priority) priority = asked;
      } else {
        slurm_error("cuwarden: CUWARDEN_PRIORITY=%s in the task's environment is not an integer from %d to %d; "
                    "QOS %s's priority %d applies",
                    own, MIN_PRIORITY, MAX_PRIORITY, qos, priority);
      }
    }
    char text[16];
    snprintf(text, sizeof text, "%d", priority);
    return spank_setenv(sp, "CUWARDEN_PRIORITY", text, 1) == ESPANK_SUCCESS ? 0 : -1;
  }
  return 0;
}

/* In every process that loads the plugin: reads plugstack.conf's arguments and registers
 * the options. */
int slurm_spank_init(spank_t sp, int ac, char **av) {
  /* Options exist where a user types them and where tasks start; slurmd and the job
   * prolog/epilog load the plugin too, and a failure there (a typo in plugstack.conf
   * included) would drain the node: there it only says what is wrong. */
  const spank_context_t ctx = spank_context();
  const int user_side = ctx == S_CTX_LOCAL || ctx == S_CTX_REMOTE || ctx == S_CTX_ALLOCATOR;
  if (read_arguments(ac, av)) return user_side ? -1 : 0;
  if (!user_side) return 0;
  for (struct spank_option *o = options; o->name; ++o)
    if (spank_option_register(sp, o) != ESPANK_SUCCESS) return -1;
  return 0;
}

/* In srun, sbatch and salloc: refuse a cap past the site's maximum before anything starts.
 * slurmstepd calls this too, when the job was accepted long ago: there task_init holds the
 * task to the maximum of the day instead. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  if (spank_remote(sp)) return 0;
  char limit[SIZE_TEXT], job_limit[SIZE_TEXT];
  if (effective(opt_limit, def_limit, max_limit, "--gpu-mem-limit", 0, limit)) return -1;
  if (effective(opt_job_limit, def_job_limit, max_job_limit, "--gpu-mem-job-limit", 0, job_limit)) return -1;
  return 0;
}

/* The task's value of `name` into `out` (SIZE_TEXT bytes), "" when unset; one too long to
 * be a size is said and taken as unset. */
static void task_env(spank_t sp, const char *name, char *out) {
  const spank_err_t got = spank_getenv(sp, name, out, SIZE_TEXT);
  if (got == ESPANK_NOSPACE)
    slurm_error("cuwarden: %s in the task's environment is too long to be a size; ignored", name);
  if (got != ESPANK_SUCCESS) out[0] = 0;
}

/* Whether `lib` is one of the entries of the LD_PRELOAD value `list` (separated by colons
 * or spaces, as ld.so reads it): a name that merely contains it is another library. */
static int preload_has(const char *list, const char *want) {
  const size_t n = strlen(want);
  for (const char *p = list; *p;) {
    while (*p == ':' || *p == ' ') ++p;
    const char *end = p;
    while (*end && *end != ':' && *end != ' ') ++end;
    if ((size_t)(end - p) == n && n && !strncmp(p, want, n)) return 1;
    p = end;
  }
  return 0;
}

/* Makes `parent`/`name`, a 0700 directory of `uid`, unless something is there: made under a
 * temporary name, given to the user, then renamed into place, so that no member ever sees it
 * as root's. Returns 0 when it is there and the user's, else -1. */
static int make_user_dir(const char *parent, const char *name, uid_t uid, gid_t gid) {
  char path[4096], tmp[4200];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", parent, name);
  if (lstat(path, &st) == 0) return S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 07777) == 0700 ? 0 : -1;
  snprintf(tmp, sizeof tmp, "%s/.new-%s-%ld", parent, name, (long)getpid());
  rmdir(tmp);
  if (mkdir(tmp, 0700) != 0) return -1;
  if (lchown(tmp, uid, gid) != 0 || chmod(tmp, 0700) != 0 ||
      renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) != 0) {
    rmdir(tmp);
    return lstat(path, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & 07777) == 0700 ? 0 : -1;
  }
  return 0;
}

static void task_caps(spank_t sp);
static void write_ceiling(uint32_t job);

/* As root, in each task before it drops to the user: the job owner's job directory, so that
 * no other user can take its name first. The run directory and its jobs/ folder are made
 * only where absent (root's, sticky, like /tmp); anything found there is left as it is (the
 * interposer then falls back, and a root daemon renames what other users put there). A
 * failure is said, never fatal: the interposer copes without the directory. Then the job's
 * ceiling file. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  uid_t uid;
  gid_t gid;
  if (geteuid() != 0 || spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS)
    return 0;
  char jobs[2048], name[32];
  struct stat st;
  if (lstat(run_dir, &st) != 0 && mkdir(run_dir, 01777) == 0) chmod(run_dir, 01777);
  if (lstat(run_dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0) return 0;
  snprintf(jobs, sizeof jobs, "%s/jobs", run_dir);
  if (lstat(jobs, &st) != 0 && mkdir(jobs, 01777) == 0) chmod(jobs, 01777);
  if (lstat(jobs, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != 0) return 0;
  snprintf(name, sizeof name, "%u", (unsigned)uid);
  if (make_user_dir(jobs, name, uid, gid) != 0)
    slurm_error("cuwarden: %s/%s is not a 0700 directory of uid %u; the job's members will use a fallback", jobs,
                name, (unsigned)uid);
  uint32_t job = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) == ESPANK_SUCCESS) {
    task_caps(sp);
    write_ceiling(job);
  }
  return 0;
}

/* The task's caps, worked out once per task (the privileged hook and task_init run in the
 * same task process; each says what it clamps only once). "" for none. */
static char task_limit[SIZE_TEXT], task_job_limit[SIZE_TEXT];
static int task_caps_known;

static void task_caps(spank_t sp) {
  if (task_caps_known) return;
  task_caps_known = 1;
  /* A cap the user set in the environment (CUWARDEN_LIMIT=8G srun ...) counts as asked for,
   * within the site's maximum, when no option was given. */
  char env_limit[SIZE_TEXT] = "", env_job_limit[SIZE_TEXT] = "";
  if (!*opt_limit) task_env(sp, "CUWARDEN_LIMIT", env_limit);
  if (!*opt_job_limit) task_env(sp, "CUWARDEN_JOB_LIMIT", env_job_limit);
  effective(*opt_limit ? opt_limit : env_limit, def_limit, max_limit, "--gpu-mem-limit", 1, task_limit);
  effective(*opt_job_limit ? opt_job_limit : env_job_limit, def_job_limit, max_job_limit, "--gpu-mem-job-limit", 1,
            task_job_limit);
  shard_cap(sp, task_job_limit);
}

/* slurm-<job>, the job's file in <run dir>/ceilings/, into `out`. */
static void ceiling_name(uint32_t job, char *out, size_t size) { snprintf(out, size, "slurm-%u", job); }

/* As root: a descriptor of <run dir>/ceilings that only root may write, or -1 (said). The run
 * directory lets every user make entries, so whatever holds the name and is not such a
 * directory (another user's directory, a symlink, a file) is renamed aside, said, and a
 * directory of root's made in its place (`make`); without `make` (the epilog), -1. The
 * checks are on the open descriptor (O_NOFOLLOW), and every file below is reached through
 * it, so a name swapped after the check changes nothing. */
static int ceilings_dir(int make) {
  char dir[2048], aside[2200];
  snprintf(dir, sizeof dir, "%s/ceilings", run_dir);
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (make && mkdir(dir, 0755) != 0 && errno != EEXIST) break;
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == 0) {
      if (!(st.st_mode & 022) || fchmod(fd, st.st_mode & 0755) == 0) return fd;
    }
    if (fd >= 0) close(fd);
    if (!make) return -1;
    static int asides; /* a name of its own each time, within one second and process too */
    snprintf(aside, sizeof aside, "%s.not-root-%ld-%ld-%d", dir, (long)time(NULL), (long)getpid(), ++asides);
    if (rename(dir, aside) != 0) break;
    slurm_error("cuwarden: %s was not a directory only root may write: moved aside to %s", dir, aside);
  }
  slurm_error("cuwarden: %s is not a directory only root may write; the job's caps have no ceiling file", dir);
  return -1;
}

/* As root: the job's ceiling file (the top of this file), written whole under a temporary
 * name and renamed into place, so that a reader never sees half of it. Nothing when the task
 * has no cap. A failure is said, never fatal: the environment still carries the caps. */
static void write_ceiling(uint32_t job) {
  if (!*task_limit && !*task_job_limit) return;
  const int dir = ceilings_dir(1);
  if (dir < 0) return;
  char name[64], tmp[96];
  ceiling_name(job, name, sizeof name);
  snprintf(tmp, sizeof tmp, "%s.new-%ld", name, (long)getpid());
  const int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    slurm_error("cuwarden: cannot write %s/ceilings/%s: %s", run_dir, tmp, strerror(errno));
    close(dir);
    return;
  }
  char text[2 * SIZE_TEXT + 64];
  int n = 0;
  if (*task_limit) n += snprintf(text + n, sizeof text - (size_t)n, "CUWARDEN_LIMIT=%s\n", task_limit);
  if (*task_job_limit) n += snprintf(text + n, sizeof text - (size_t)n, "CUWARDEN_JOB_LIMIT=%s\n", task_job_limit);
  const int ok = fchmod(fd, 0644) == 0 && write(fd, text, (size_t)n) == n;
  if (close(fd) != 0 || !ok || renameat(dir, tmp, dir, name) != 0) {
    slurm_error("cuwarden: cannot write %s/ceilings/%s: %s", run_dir, name, strerror(errno));
    unlinkat(dir, tmp, 0);
  }
  close(dir);
}

/* In the job's epilog, as root: its ceiling file goes with it, from a ceilings directory of
 * root's only (never through another user's directory or symlink). Slurm (22.05) calls no
 * slurm_spank_init before the job's prolog and epilog, so plugstack.conf's arguments (run_dir=)
 * are read here again; a bad one is said and leaves the file, never fails the epilog (that
 * would drain the node). */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av) {
  uint32_t job = 0;
  char name[64];
  if (geteuid() != 0 || read_arguments(ac, av) || spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
  const int dir = ceilings_dir(0);
  if (dir < 0) return 0;
  ceiling_name(job, name, sizeof name);
  unlinkat(dir, name, 0);
  close(dir);
  return 0;
}

/* In each task, before it runs the user's program: the preload, the job and its caps. */
int slurm_spank_task_init(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  uint32_t job = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return -1;
  task_caps(sp);
  char limit[SIZE_TEXT], job_limit[SIZE_TEXT];
  snprintf(limit, sizeof limit, "%s", task_limit);
  snprintf(job_limit, sizeof job_limit, "%s", task_job_limit);

  /* The user's own preloads stay, after ours; one too long to read is an error, not dropped. */
  static char preload[65536], old[sizeof preload - 2048];
  old[0] = 0;
  const spank_err_t got = spank_getenv(sp, "LD_PRELOAD", old, sizeof old);
  if (got != ESPANK_SUCCESS && got != ESPANK_ENV_NOEXIST) {
    slurm_error("cuwarden: cannot read the task's LD_PRELOAD: %s", spank_strerror(got));
    return -1;
  }
  if (got != ESPANK_SUCCESS) old[0] = 0;
  if (*old && !preload_has(old, lib))
    snprintf(preload, sizeof preload, "%s:%s", lib, old);
  else
    snprintf(preload, sizeof preload, "%s", *old ? old : lib);
  char name[32];
  snprintf(name, sizeof name, "slurm-%u", job);
  if (spank_setenv(sp, "LD_PRELOAD", preload, 1) != ESPANK_SUCCESS ||
      spank_setenv(sp, "CUWARDEN_JOB", name, 1) != ESPANK_SUCCESS)
    return -1;
  /* The plugin's caps win over the task's environment: a site maximum must hold. */
  if (*limit && spank_setenv(sp, "CUWARDEN_LIMIT", limit, 1) != ESPANK_SUCCESS) return -1;
  if (*job_limit && spank_setenv(sp, "CUWARDEN_JOB_LIMIT", job_limit, 1) != ESPANK_SUCCESS) return -1;
  /* What decides enforcement, whatever the task's environment says (the top of this file). */
  if (spank_setenv(sp, "CUWARDEN_ON_ERROR", "fail", 1) != ESPANK_SUCCESS ||
      spank_setenv(sp, "CUWARDEN_CONFIG", "off", 1) != ESPANK_SUCCESS ||
      spank_setenv(sp, "CUWARDEN_RUN_DIR", run_dir, 1) != ESPANK_SUCCESS)
    return -1;
  return qos_priority(sp);
}
