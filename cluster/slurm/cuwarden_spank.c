/* cuwarden SPANK plugin: --gpu-mem-limit=SIZE and --gpu-mem-job-limit=SIZE for srun, sbatch
 * and salloc. Each task of a job gets the interposer preloaded, its per-process cap
 * (CUWARDEN_LIMIT), and the job name slurm-<jobid> (CUWARDEN_JOB) with the job's cap
 * (CUWARDEN_JOB_LIMIT), so that all tasks of one job on a node share one cap per GPU.
 *
 * plugstack.conf (arguments are optional; sizes as the interposer reads them):
 *   required /usr/lib/x86_64-linux-gnu/cuwarden/cuwarden_spank.so \
 *       lib=/usr/lib/x86_64-linux-gnu/cuwarden/libcuwarden.so default=16G max=80G \
 *       job_default=80G job_max=320G run_dir=/dev/shm/cuwarden
 *
 * Sizes are checked here only as far as a site maximum needs (bytes, K M G T, KiB MiB GiB
 * TiB, kB MB GB TB); the interposer checks every value again and names a bad one at the
 * task's first CUDA call. A share ("75%") is passed on when the site sets no maximum. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(cuwarden, 1)

#define SIZE_TEXT 64

/* What the plugin's arguments and the user's options say; one copy per process (srun,
 * sbatch, slurmstepd). */
static char opt_limit[SIZE_TEXT], opt_job_limit[SIZE_TEXT];
static char def_limit[SIZE_TEXT], def_job_limit[SIZE_TEXT];
static uint64_t max_limit, max_job_limit; /* bytes; 0 = none */
static char lib[1024] = "/usr/lib/x86_64-linux-gnu/cuwarden/libcuwarden.so";
static char run_dir[1024];

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

/* Copies `value` into `dst` (SIZE_TEXT bytes) when it is a plausible size; else says why. */
static int take_size(const char *what, const char *value, char *dst) {
  if (!value || !*value || strlen(value) >= SIZE_TEXT || strchr(value, ',') || strchr(value, '=')) {
    slurm_error("cuwarden: %s='%s': expected a size such as 8G or 512MiB", what, value ? value : "");
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

/* Reads plugstack.conf's arguments: lib= default= max= job_default= job_max= run_dir=. */
static int read_arguments(int ac, char **av) {
  for (int i = 0; i < ac; ++i) {
    const char *a = av[i];
    const char *eq = strchr(a, '=');
    const char *v = eq ? eq + 1 : "";
    const size_t klen = eq ? (size_t)(eq - a) : strlen(a);
    uint64_t *max = NULL;
    if (klen == 3 && !strncmp(a, "lib", 3))
      snprintf(lib, sizeof lib, "%s", v);
    else if (klen == 7 && !strncmp(a, "run_dir", 7))
      snprintf(run_dir, sizeof run_dir, "%s", v);
    else if (klen == 7 && !strncmp(a, "default", 7)) {
      if (take_size("plugstack.conf default", v, def_limit)) return -1;
    } else if (klen == 11 && !strncmp(a, "job_default", 11)) {
      if (take_size("plugstack.conf job_default", v, def_job_limit)) return -1;
    } else if (klen == 3 && !strncmp(a, "max", 3))
      max = &max_limit;
    else if (klen == 7 && !strncmp(a, "job_max", 7))
      max = &max_job_limit;
    else {
      slurm_error("cuwarden: plugstack.conf: unknown argument '%s' (lib= default= max= job_default= job_max= run_dir=)",
                  a);
      return -1;
    }
    if (max && (*max = size_bytes(v)) == UINT64_MAX) {
      slurm_error("cuwarden: plugstack.conf: '%s': a maximum is a size such as 80G", a);
      return -1;
    }
  }
  return 0;
}

/* The cap to give: the user's, else the site's default; refused past the site's maximum.
 * Returns "" for none, or NULL after saying why. */
static const char *effective(const char *asked, const char *dflt, uint64_t max, const char *option) {
  const char *v = *asked ? asked : dflt;
  if (!*v) return v;
  if (max) {
    const uint64_t b = size_bytes(v);
    if (b == UINT64_MAX) {
      slurm_error("cuwarden: %s=%s: this site caps it at %llu bytes: give a size (bytes, K M G T)", option, v,
                  (unsigned long long)max);
      return NULL;
    }
    if (b > max) {
      slurm_error("cuwarden: %s=%s is more than this site's maximum of %llu bytes", option, v,
                  (unsigned long long)max);
      return NULL;
    }
  }
  return v;
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

/* In srun, sbatch and salloc: refuse a cap past the site's maximum before anything starts. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
  (void)sp;
  (void)ac;
  (void)av;
  if (!effective(opt_limit, def_limit, max_limit, "--gpu-mem-limit")) return -1;
  if (!effective(opt_job_limit, def_job_limit, max_job_limit, "--gpu-mem-job-limit")) return -1;
  return 0;
}

/* In each task, before it runs the user's program: the preload, the job and its caps. */
int slurm_spank_task_init(spank_t sp, int ac, char **av) {
  (void)ac;
  (void)av;
  uint32_t job = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return -1;
  const char *limit = effective(opt_limit, def_limit, max_limit, "--gpu-mem-limit");
  const char *job_limit = effective(opt_job_limit, def_job_limit, max_job_limit, "--gpu-mem-job-limit");
  if (!limit || !job_limit) return -1;

  char preload[4096], old[3072] = "";
  if (spank_getenv(sp, "LD_PRELOAD", old, sizeof old) == ESPANK_SUCCESS && *old && !strstr(old, lib))
    snprintf(preload, sizeof preload, "%s:%s", lib, old);
  else
    snprintf(preload, sizeof preload, "%s", *old && strstr(old, lib) ? old : lib);
  char name[32];
  snprintf(name, sizeof name, "slurm-%u", job);
  if (spank_setenv(sp, "LD_PRELOAD", preload, 1) != ESPANK_SUCCESS ||
      spank_setenv(sp, "CUWARDEN_JOB", name, 1) != ESPANK_SUCCESS)
    return -1;
  /* The plugin's caps win over the task's environment: a site maximum must hold. */
  if (*limit && spank_setenv(sp, "CUWARDEN_LIMIT", limit, 1) != ESPANK_SUCCESS) return -1;
  if (*job_limit && spank_setenv(sp, "CUWARDEN_JOB_LIMIT", job_limit, 1) != ESPANK_SUCCESS) return -1;
  if (*run_dir && spank_setenv(sp, "CUWARDEN_RUN_DIR", run_dir, 1) != ESPANK_SUCCESS) return -1;
  return 0;
}
