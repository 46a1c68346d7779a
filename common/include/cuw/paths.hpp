// cuwarden: where rings, job segments and the daemon socket live (CUWARDEN_RUN_DIR).
#pragma once

#include <cstdint>
#include <string>

#include "cuw/options.hpp"

namespace cuw::paths {

/// Default run directory when CUWARDEN_RUN_DIR is unset (the options table's default): tmpfs,
/// visible to every user.
inline constexpr const char* kDefaultRunDir = options::get(options::Id::CUWARDEN_RUN_DIR).default_value;
inline constexpr const char* kSocketName = "cuwardend.sock";
inline constexpr const char* kRingPrefix = "ring-";
inline constexpr const char* kRingSuffix = ".cwr";

/// CUWARDEN_RUN_DIR (read with secure_getenv, so setuid programs get the default) or the
/// default. Never empty.
std::string run_dir();

/// The run directory a CUWARDEN_RUN_DIR value names: `value` without its trailing slashes (a
/// lone "/" stays), or kDefaultRunDir when `value` is null or empty. Never empty.
std::string run_dir_from(const char* value);

/// Where a root daemon serves when no run directory is set: a directory only root can write,
/// apart from the world-writable run directory, so no user can bind the socket's name first.
inline constexpr const char* kDefaultSocketDir = "/run/cuwarden";
/// The socket's directory inside a run directory that is set: owned by the daemon's uid, 0755.
inline constexpr const char* kRunDirSocketDir = "daemon";

/// The daemon's socket by the one rule every part follows (daemon, CLI, interposer, tests):
/// `socket` when non-empty (CUWARDEN_SOCKET, --socket); else, when `run_dir` is set and is
/// not kDefaultRunDir, `<run_dir>/daemon/cuwardend.sock`; else
/// `/run/cuwarden/cuwardend.sock`. `socket` and `run_dir` may be null. Pure; allocates.
std::string socket_path_for(const char* socket, const char* run_dir);

/// socket_path_for(CUWARDEN_SOCKET, CUWARDEN_RUN_DIR), both read with secure_getenv.
std::string socket_path();

/// Whether a client may believe what is said at socket `path`: its directory (lstat, no link
/// followed) belongs to root or to the caller's effective uid. False with *why set
/// ("/x is owned by uid 1002, not root or you") otherwise; a missing directory is false too.
/// Thread-safe; one system call.
bool trusted_socket_dir(const std::string& path, std::string* why);

/// Whether the server on connected unix socket `fd` may be believed: its credentials
/// (SO_PEERCRED, taken when it listened) name root or the caller's effective uid. False with
/// *why set otherwise. Thread-safe; one system call.
bool trusted_peer(int fd, std::string* why);

/// "uid N (name)", or "uid N" when the user database has no name for it: how messages name
/// the owner of a file that is not used. Reads the user database (getpwuid_r); thread-safe.
std::string owner_text(uint32_t uid);

/// File name (no directory) of a process's ring: "ring-<pid>-<starttime>.cwr".
std::string ring_file_name(uint32_t pid, uint64_t start_time);

/// Parse a ring file name; false if `name` is not one.
bool parse_ring_file_name(const std::string& name, uint32_t* pid, uint64_t* start_time);

/// starttime (field 22 of /proc/<pid>/stat, clock ticks since boot), or 0 if the process
/// does not exist or the file cannot be parsed. Opens a file: never call from a hook
/// before the first CUDA call.
uint64_t process_start_time(uint32_t pid);

/// State letter (field 3: 'R', 'S', 'Z', ...) and starttime (field 22) of /proc/<pid>/stat.
/// False if the process does not exist or the file cannot be parsed. Opens a file, like
/// process_start_time().
bool process_stat(uint32_t pid, char* state, uint64_t* start_time);

/// starttime of the calling process (/proc/self/stat, right whichever pid namespace /proc
/// was mounted for), or 0 when unreadable. Opens a file, like process_start_time().
uint64_t self_start_time();

/// True only when it is proven, in the caller's pid namespace, that the process that wrote a
/// ring as (`pid`, `start_time`) is gone: no process has that pid (pidfd_open), or /proc,
/// when it shows the caller's own namespace, shows another process under that pid (another
/// start time) or a zombie. A process that cannot be seen (an unreadable /proc, a /proc of
/// another namespace) is presumed alive. `pid` is in the caller's namespace: map a ring's
/// with host_pid() first. Opens files, like process_start_time().
bool process_gone(uint32_t pid, uint64_t start_time);

/// Inode of the pid namespace process `pid` (as this process numbers it) lives in, from
/// /proc/<pid>/ns/pid; 0 when the process is gone or its namespace may not be read (another
/// user's process without CAP_SYS_PTRACE). Opens no file; one stat.
uint64_t pid_namespace(uint32_t pid);

/// Process `pid`'s number in its own, innermost pid namespace: the last field of the
/// "NSpid:" line of /proc/<pid>/status (pid itself when it shares ours); 0 when unknown.
/// Opens a file, like process_start_time().
uint32_t innermost_pid(uint32_t pid);

/// The pid, in the caller's pid namespace, of the process whose pid is `ns_pid` in the pid
/// namespace of inode `pidns` (RingHeader::pidns): `ns_pid` itself when `pidns` is 0 (a
/// writer that predates the field) or the caller's own; else found by a walk of /proc (the
/// `NSpid:` line of each /proc/PID/status, then /proc/PID/ns/pid). -1 when no process
/// matches or /proc is not the caller's namespace's: such a process cannot be judged.
/// Reads all of /proc: not for a hot path.
int64_t host_pid(uint64_t pidns, uint32_t ns_pid);

/// Removes from run directory `dir` the rings of processes proven gone (process_gone) whose
/// files belong to user `uid` and whose writers recorded the caller's own pid namespace: a
/// process killed while no daemon ran leaves its ring behind (and its live segment, removed
/// with it). Other users' rings, and rings of other namespaces or of writers that predate
/// the namespace field, are the daemon's to clean. Regular files with a ring's name only;
/// never follows a link. Returns how many were removed. Opens the directory and /proc
/// files: not for a hook before the first CUDA call.
int remove_dead_rings(const std::string& dir, uint32_t uid);

}  // namespace cuw::paths
