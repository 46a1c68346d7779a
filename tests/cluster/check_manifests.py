#!/usr/bin/env python3
"""The Kubernetes manifests (cluster/kubernetes/*.yaml) against the required fields of their API
versions (v1 Namespace, ConfigMap and Pod, apps/v1 DaemonSet and the other workload kinds,
batch/v1 Job and CronJob, networking.k8s.io/v1 NetworkPolicy), without a cluster: names,
selectors that match their template's labels, containers with a name and an image, mounts
that name declared volumes, string-valued labels and annotations, ports in range, and the
fields a typo would misspell. Then cuwarden's own wiring and isolation: the daemon (hostPID,
capabilities dropped but those it needs, a read-only root filesystem, no privilege
escalation, seccomp RuntimeDefault, HTTP on loopback unless a NetworkPolicy admits only
chosen namespaces) follows the node's pods directory, and every workload, whatever its kind,
has no hostPID, mounts only its own pods/<pod UID> (subPathExpr of metadata.uid), never the
node's run directory or the daemon's socket, and runs its interposed containers as non-root
without privilege escalation or capabilities.

    check_manifests.py DIR              check every *.yaml in DIR
    check_manifests.py DIR --self-test  also check that each of a list of breakages is caught
"""
import copy
import pathlib
import posixpath
import re
import sys

import yaml

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
KINDS = {"Namespace": "v1", "ConfigMap": "v1", "Pod": "v1", "DaemonSet": "apps/v1", "Deployment": "apps/v1",
         "StatefulSet": "apps/v1", "ReplicaSet": "apps/v1", "Job": "batch/v1", "CronJob": "batch/v1",
         "NetworkPolicy": "networking.k8s.io/v1"}
CONTROLLERS = {"DaemonSet", "Deployment", "StatefulSet", "ReplicaSet"}  # spec.selector + spec.template

# The fields of the API (core/v1, apps/v1) each object may hold; a key outside them is a typo
# that the API server would reject (strict field validation) or silently drop.
METADATA = {"name", "namespace", "labels", "annotations", "generateName"}
POD_SPEC = {"containers", "initContainers", "volumes", "restartPolicy", "hostPID", "hostNetwork", "hostIPC",
            "nodeSelector", "tolerations", "affinity", "serviceAccountName", "securityContext",
            "terminationGracePeriodSeconds", "priorityClassName", "runtimeClassName", "dnsPolicy",
            "imagePullSecrets", "schedulerName", "shareProcessNamespace", "enableServiceLinks"}
CONTAINER = {"name", "image", "command", "args", "env", "envFrom", "ports", "resources", "volumeMounts",
             "readinessProbe", "livenessProbe", "startupProbe", "securityContext", "imagePullPolicy",
             "workingDir", "stdin", "tty", "lifecycle", "terminationMessagePath", "terminationMessagePolicy"}
VOLUME_SOURCES = {"hostPath", "configMap", "emptyDir", "secret", "persistentVolumeClaim", "projected",
                  "downwardAPI", "csi", "ephemeral"}
MOUNT = {"name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation", "recursiveReadOnly"}
CONTAINER_SECURITY = {"runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                      "capabilities", "seccompProfile", "privileged", "procMount", "seLinuxOptions", "appArmorProfile"}
POD_SECURITY = {"runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "fsGroupChangePolicy", "supplementalGroups",
                "seccompProfile", "seLinuxOptions", "sysctls", "appArmorProfile"}
RESTART = {"Always", "OnFailure", "Never"}
HOST_PATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                   "BlockDevice"}


class Checker:
    def __init__(self):
        self.errors = []

    def fail(self, where, why):
        self.errors.append(f"{where}: {why}")

    def string_map(self, where, m):
        if m is None:
            return {}
        if not isinstance(m, dict):
            self.fail(where, "expected a map")
            return {}
        for k, v in m.items():
            if not isinstance(k, str) or not isinstance(v, str):
                self.fail(where, f"{k!r}: {v!r}: keys and values must be strings (quote true, 9477)")
        return m

    def keys(self, where, obj, allowed):
        for k in obj:
            if k not in allowed:
                self.fail(where, f"unknown field {k!r}")

    def metadata(self, where, md):
        if not isinstance(md, dict):
            self.fail(where, "metadata: required")
            return {}
        self.keys(f"{where}.metadata", md, METADATA)
        name = md.get("name")
        if not isinstance(name, str) or not DNS_SUBDOMAIN.match(name):
            self.fail(where, f"metadata.name: required, a DNS subdomain (got {name!r})")
        if "namespace" in md and not (isinstance(md["namespace"], str) and DNS_LABEL.match(md["namespace"])):
            self.fail(where, f"metadata.namespace: a DNS label (got {md['namespace']!r})")
        self.string_map(f"{where}.metadata.labels", md.get("labels"))
        self.string_map(f"{where}.metadata.annotations", md.get("annotations"))
        return md

    def container(self, where, c, volumes, seen):
        if not isinstance(c, dict):
            self.fail(where, "expected a map")
            return
        self.keys(where, c, CONTAINER)
        name = c.get("name")
        if not isinstance(name, str) or not DNS_LABEL.match(name):
            self.fail(where, f"name: required, a DNS label (got {name!r})")
        elif name in seen:
            self.fail(where, f"name {name!r} used twice in the pod")
        seen.add(name)
        if not isinstance(c.get("image"), str) or not c["image"]:
            self.fail(where, "image: required")
        for key in ("command", "args"):
            if key in c and not (isinstance(c[key], list) and all(isinstance(a, str) for a in c[key])):
                self.fail(where, f"{key}: a list of strings")
        ports = set()
        for i, p in enumerate(c.get("ports") or []):
            port = p.get("containerPort") if isinstance(p, dict) else None
            if not isinstance(port, int) or not 1 <= port <= 65535:
                self.fail(f"{where}.ports[{i}]", f"containerPort: required, 1..65535 (got {port!r})")
            pname = p.get("name") if isinstance(p, dict) else None
            if pname is not None:
                if not isinstance(pname, str) or len(pname) > 15 or not DNS_LABEL.match(pname):
                    self.fail(f"{where}.ports[{i}]", f"name: at most 15 characters, a DNS label (got {pname!r})")
                ports.add(pname)
            if isinstance(p, dict) and p.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
                self.fail(f"{where}.ports[{i}]", f"protocol: TCP, UDP or SCTP (got {p['protocol']!r})")
        for i, e in enumerate(c.get("env") or []):
            if not isinstance(e, dict) or not isinstance(e.get("name"), str) or not e["name"]:
                self.fail(f"{where}.env[{i}]", "name: required")
                continue
            if "value" in e and not isinstance(e["value"], str):
                self.fail(f"{where}.env[{i}]", f"{e['name']}: value must be a string (got {e['value']!r})")
            if "value" in e and "valueFrom" in e:
                self.fail(f"{where}.env[{i}]", f"{e['name']}: value and valueFrom are exclusive")
        for i, m in enumerate(c.get("volumeMounts") or []):
            if not isinstance(m, dict):
                self.fail(f"{where}.volumeMounts[{i}]", "expected a map")
                continue
            self.keys(f"{where}.volumeMounts[{i}]", m, MOUNT)
            if "subPath" in m and "subPathExpr" in m:
                self.fail(f"{where}.volumeMounts[{i}]", "subPath and subPathExpr are exclusive")
            if m.get("name") not in volumes:
                self.fail(f"{where}.volumeMounts[{i}]", f"name {m.get('name')!r} is not a volume of the pod")
            if not isinstance(m.get("mountPath"), str) or not m["mountPath"].startswith("/"):
                self.fail(f"{where}.volumeMounts[{i}]", f"mountPath: required, absolute (got {m.get('mountPath')!r})")
        if "securityContext" in c:
            self.keys(f"{where}.securityContext", c["securityContext"] or {}, CONTAINER_SECURITY)
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            get = (c.get(probe) or {}).get("httpGet")
            if get is not None:
                port = get.get("port")
                if not (isinstance(port, int) and 1 <= port <= 65535) and port not in ports:
                    self.fail(f"{where}.{probe}", f"httpGet.port {port!r}: neither a port number nor a named port")

    def pod_spec(self, where, spec):
        if not isinstance(spec, dict):
            self.fail(where, "spec: required")
            return
        self.keys(where, spec, POD_SPEC)
        if "securityContext" in spec:
            self.keys(f"{where}.securityContext", spec["securityContext"] or {}, POD_SECURITY)
        volumes = {}
        for i, v in enumerate(spec.get("volumes") or []):
            vw = f"{where}.volumes[{i}]"
            if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not DNS_LABEL.match(v["name"]):
                self.fail(vw, "name: required, a DNS label")
                continue
            if v["name"] in volumes:
                self.fail(vw, f"name {v['name']!r} declared twice")
            sources = [k for k in v if k != "name"]
            if len(sources) != 1 or sources[0] not in VOLUME_SOURCES:
                self.fail(vw, f"exactly one volume source (got {sources})")
            hp = v.get("hostPath")
            if hp is not None:
                if not isinstance(hp.get("path"), str) or not hp["path"].startswith("/"):
                    self.fail(vw, "hostPath.path: required, absolute")
                if hp.get("type", "") not in HOST_PATH_TYPES:
                    self.fail(vw, f"hostPath.type {hp.get('type')!r} is not a hostPath type")
            if "configMap" in v and not (v["configMap"] or {}).get("name"):
                self.fail(vw, "configMap.name: required")
            volumes[v["name"]] = v
        if not isinstance(spec.get("containers"), list) or not spec["containers"]:
            self.fail(where, "containers: required, at least one")
        seen = set()
        for key in ("initContainers", "containers"):
            for i, c in enumerate(spec.get(key) or []):
                self.container(f"{where}.{key}[{i}]", c, volumes, seen)
        if "restartPolicy" in spec and spec["restartPolicy"] not in RESTART:
            self.fail(where, f"restartPolicy: Always, OnFailure or Never (got {spec['restartPolicy']!r})")
        self.string_map(f"{where}.nodeSelector", spec.get("nodeSelector"))
        return volumes

    def document(self, where, doc):
        if not isinstance(doc, dict):
            self.fail(where, "expected a map")
            return
        kind = doc.get("kind")
        if kind not in KINDS:
            self.fail(where, f"kind {kind!r} is none of {sorted(KINDS)}")
            return
        if doc.get("apiVersion") != KINDS[kind]:
            self.fail(where, f"{kind}: apiVersion must be {KINDS[kind]} (got {doc.get('apiVersion')!r})")
        where = f"{where} ({kind} {(doc.get('metadata') or {}).get('name')})"
        self.metadata(where, doc.get("metadata"))
        if kind == "ConfigMap":
            self.string_map(f"{where}.data", doc.get("data"))
        elif kind == "Pod":
            self.pod_spec(f"{where}.spec", doc.get("spec"))
        elif kind in CONTROLLERS:
            spec = doc.get("spec")
            if not isinstance(spec, dict):
                self.fail(where, "spec: required")
                return
            match = ((spec.get("selector") or {}).get("matchLabels"))
            if not isinstance(match, dict) or not match:
                self.fail(where, "spec.selector.matchLabels: required, not empty")
                match = {}
            template = spec.get("template")
            if not isinstance(template, dict):
                self.fail(where, "spec.template: required")
                return
            labels = self.string_map(f"{where}.spec.template.metadata.labels",
                                     (template.get("metadata") or {}).get("labels"))
            for k, v in match.items():
                if labels.get(k) != v:
                    self.fail(where, f"spec.selector.matchLabels {k}={v!r} does not match the template's labels")
            self.string_map(f"{where}.spec.template.metadata.annotations",
                            (template.get("metadata") or {}).get("annotations"))
            self.pod_spec(f"{where}.spec.template.spec", template.get("spec"))
        elif kind in ("Job", "CronJob"):
            spec = doc.get("spec") or {}
            if kind == "CronJob":
                spec = (spec.get("jobTemplate") or {}).get("spec") or {}
            self.pod_spec(f"{where} template.spec", (spec.get("template") or {}).get("spec"))
        elif kind == "NetworkPolicy":
            spec = doc.get("spec")
            if not isinstance(spec, dict) or not isinstance(spec.get("podSelector"), dict):
                self.fail(where, "spec.podSelector: required")


def pod_specs(docs):
    """(kind name, namespace, pod labels, pod spec) of every object that runs pods."""
    for doc in docs:
        kind = doc.get("kind")
        md = doc.get("metadata") or {}
        spec = doc.get("spec") or {}
        where = f"{kind} {md.get('name')}"
        if kind == "Pod":
            yield where, md.get("namespace", "default"), md.get("labels") or {}, spec
        elif kind in CONTROLLERS or kind in ("Job", "CronJob"):
            if kind == "CronJob":
                spec = (spec.get("jobTemplate") or {}).get("spec") or {}
            template = spec.get("template") or {}
            yield where, md.get("namespace", "default"), (template.get("metadata") or {}).get("labels") or {}, \
                template.get("spec") or {}


def under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")


def covering_mount(spec, container, path):
    """The mount of `container` under which `path` lies (the deepest), and its volume."""
    volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    best = None
    for m in container.get("volumeMounts") or []:
        mp = m.get("mountPath", "").rstrip("/") or "/"
        if under(path, mp) and (best is None or len(mp) > len(best[0].get("mountPath", "").rstrip("/"))):
            best = (m, volumes.get(m.get("name")) or {})
    return best


def mount_host_root(m, volume):
    """Where on the node a hostPath mount's root lies (its subPath or subPathExpr appended), or None."""
    hp = volume.get("hostPath")
    if not hp:
        return None
    root = hp.get("path", "").rstrip("/") or "/"
    sub = m.get("subPath") or m.get("subPathExpr")
    return posixpath.normpath(f"{root}/{sub}") if sub else root


def host_location(spec, container, path):
    """Where `path` of `container` lies on the node; None: on no mount; "(not a hostPath)"."""
    found = covering_mount(spec, container, path)
    if found is None:
        return None
    m, volume = found
    root = mount_host_root(m, volume)
    if root is None:
        return "(not a hostPath)"
    rest = path[len(m.get("mountPath", "").rstrip("/")):]
    return posixpath.normpath(root + rest)


def option(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd and cmd.index(name) + 1 < len(cmd) else None


def seccomp_type(spec, c):
    profile = (c.get("securityContext") or {}).get("seccompProfile") or \
        (spec.get("securityContext") or {}).get("seccompProfile") or {}
    return profile.get("type")


def confined(ck, where, spec, c, may_add):
    """No privilege escalation, every capability dropped but `may_add`, seccomp RuntimeDefault."""
    sc = c.get("securityContext") or {}
    if sc.get("allowPrivilegeEscalation") is not False:
        ck.fail(where, "securityContext.allowPrivilegeEscalation must be false")
    if sc.get("privileged"):
        ck.fail(where, "securityContext.privileged must not be set")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        ck.fail(where, "securityContext.capabilities.drop must hold ALL")
    extra = set(caps.get("add") or []) - may_add
    if extra:
        ck.fail(where, f"securityContext.capabilities.add: {sorted(extra)} beyond {sorted(may_add) or 'none'}")
    if seccomp_type(spec, c) != "RuntimeDefault":
        ck.fail(where, "seccompProfile.type must be RuntimeDefault (the container's or the pod's)")


def loopback(host):
    return host.startswith("127.") or host in ("localhost", "[::1]", "::1")


def admits_only_chosen(policy):
    """Whether every ingress rule of `policy` names namespaces or pods (no rule open to all)."""
    spec = policy.get("spec") or {}
    if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
        return False
    for rule in spec.get("ingress") or []:
        peers = rule.get("from") or []
        if not peers:
            return False
        for peer in peers:
            if "ipBlock" in peer:
                return False
            ns = peer.get("namespaceSelector")
            if ns is not None and not (ns.get("matchLabels") or ns.get("matchExpressions")):
                return False
            if ns is None and "podSelector" not in peer:
                return False
    return True


def selects(policy, namespace, labels):
    md = policy.get("metadata") or {}
    sel = ((policy.get("spec") or {}).get("podSelector") or {})
    return md.get("namespace", "default") == namespace and not sel.get("matchExpressions") and \
        all(labels.get(k) == v for k, v in (sel.get("matchLabels") or {}).items())


# What cuwardend may keep (packaging/systemd/cuwardend.service.in's CapabilityBoundingSet).
DAEMON_CAPS = {"DAC_OVERRIDE", "FOWNER", "CHOWN", "SETUID", "SETGID", "SETPCAP", "SYS_PTRACE"}
WORKLOAD_INIT_CAPS = {"CHOWN"}  # the job directory given to the workload's user


def daemon(ck, docs):
    """The cuwardend container's checks; (run dir, pods dir, socket) on the node, or None."""
    policies = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    found = None
    for name, namespace, labels, spec in pod_specs(docs):
        for c in spec.get("containers") or []:
            cmd = list(c.get("command") or []) + list(c.get("args") or [])
            if not cmd or cmd[0] != "cuwardend":
                continue
            if not spec.get("hostPID"):
                ck.fail(name, "the daemon needs hostPID: it maps each ring's pid namespace to host pids")
            run, pods, http = option(cmd, "--run-dir"), option(cmd, "--pods-dir"), option(cmd, "--http")
            if not run or not http:
                ck.fail(name, "cuwardend needs --run-dir (the node's) and --http (for Prometheus)")
                continue
            if not pods:
                ck.fail(name, "cuwardend needs --pods-dir: the directory of the pods' own run directories")
            if not loopback(http.rsplit(":", 1)[0]) and \
                    not any(selects(p, namespace, labels) and admits_only_chosen(p) for p in policies):
                ck.fail(name, f"--http {http} is open to every pod: listen on loopback, or add a NetworkPolicy "
                              f"that selects the daemon and admits only chosen namespaces")
            where = f"{name} container {c.get('name')}"
            confined(ck, where, spec, c, DAEMON_CAPS)
            if (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
                ck.fail(where, "securityContext.readOnlyRootFilesystem must be true")
            for i, init in enumerate(spec.get("initContainers") or []):
                confined(ck, f"{name} initContainers[{i}]", spec, init, DAEMON_CAPS)
            host_run = host_location(spec, c, run)
            host_pods = host_location(spec, c, pods) if pods else "/(no --pods-dir)"
            if not (host_run or "(").startswith("/") or not (host_pods or "(").startswith("/"):
                ck.fail(name, "cuwardend's --run-dir and --pods-dir must lie on hostPath volumes")
                continue
            socket = option(cmd, "--socket") or run.rstrip("/") + "/daemon/cuwardend.sock"
            found = (host_run, host_pods, host_location(spec, c, socket) or socket)
    if found is None and not ck.errors:
        ck.fail("manifests", "no cuwardend container")
    return found


def pod_uid_variable(c, expr):
    """Whether subPathExpr `expr` is $(VAR) with VAR the pod's UID (downward API) in `c`'s env."""
    if not (expr.startswith("$(") and expr.endswith(")")) or "/" in expr:
        return False
    for e in c.get("env") or []:
        if isinstance(e, dict) and e.get("name") == expr[2:-1]:
            return ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "metadata.uid"
    return False


def workload(ck, name, spec, node):
    """A pod that is not the daemon's: its own pods/<UID> only, no hostPID, confined containers."""
    host_run, host_pods, host_socket = node
    if spec.get("hostPID"):
        ck.fail(name, "hostPID on a workload: it would see and signal every process of the node")
    pod_sc = spec.get("securityContext") or {}
    for key in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(key) or []):
            where = f"{name} {key}[{i}] ({c.get('name')})"
            volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
            for m in c.get("volumeMounts") or []:
                volume = volumes.get(m.get("name")) or {}
                loc = mount_host_root(m, volume)
                if loc is None:
                    continue
                if under(host_run, loc):
                    ck.fail(where, f"mounts the node's {loc}, which holds the whole run directory {host_run}")
                elif under(loc, host_socket) or under(host_socket, loc):
                    ck.fail(where, f"mounts the node's {loc}: the daemon's socket is {host_socket}")
                elif under(loc, host_pods):
                    hp = volume["hostPath"].get("path", "").rstrip("/")
                    if hp != host_pods or not pod_uid_variable(c, m.get("subPathExpr") or ""):
                        ck.fail(where, f"mounts the node's {loc}: a pod mounts {host_pods} only with "
                                       f"subPathExpr $(VAR), VAR its metadata.uid")
                elif under(loc, host_run):
                    ck.fail(where, f"mounts the node's {loc}, the daemon's part of the run directory")
            env = {e.get("name"): e.get("value") for e in c.get("env") or [] if isinstance(e, dict)}
            if key == "initContainers":
                confined(ck, where, spec, c, WORKLOAD_INIT_CAPS)
                continue
            if "LD_PRELOAD" not in env:
                continue
            if host_location(spec, c, env["LD_PRELOAD"] or "") is None:
                ck.fail(where, f"LD_PRELOAD={env['LD_PRELOAD']} lies on no mounted volume")
            run = env.get("CUWARDEN_RUN_DIR")
            found = covering_mount(spec, c, run) if run else None
            if not run:
                ck.fail(where, "an interposed container needs CUWARDEN_RUN_DIR (its /dev/shm is the pod's own)")
            elif found is None or ((found[1].get("hostPath") or {}).get("path", "").rstrip("/") != host_pods
                                   or "subPathExpr" not in found[0]):
                ck.fail(where, f"CUWARDEN_RUN_DIR={run} lies on the node's {host_location(spec, c, run)}, not on "
                               f"the pod's own directory of {host_pods}")
            confined(ck, where, spec, c, set())
            sc = c.get("securityContext") or {}
            non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
            uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
            if non_root is not True or uid == 0:
                ck.fail(where, "an interposed container runs as non-root (runAsNonRoot: true, runAsUser not 0)")


def wiring(ck, docs):
    """cuwarden's own: the daemon confined and following the pods directory, each workload isolated."""
    config_maps = {d["metadata"]["name"] for d in docs if d.get("kind") == "ConfigMap"}
    for name, _, _, spec in pod_specs(docs):
        for v in spec.get("volumes") or []:
            cm = (v.get("configMap") or {}).get("name")
            if cm and cm not in config_maps:
                ck.fail(name, f"volume {v.get('name')!r} names ConfigMap {cm!r}, which no manifest defines")
    node = daemon(ck, docs)
    if node is None:
        return
    for name, _, _, spec in pod_specs(docs):
        if not any((c.get("command") or [None])[0] == "cuwardend" for c in spec.get("containers") or []):
            workload(ck, name, spec, node)


def check(docs):
    ck = Checker()
    for i, doc in enumerate(docs):
        ck.document(f"document {i}", doc)
    if not ck.errors:
        wiring(ck, docs)
    return ck.errors


def load(directory):
    docs = []
    for path in sorted(pathlib.Path(directory).glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def find(docs, kind):
    return next(d for d in docs if d.get("kind") == kind)


def breakages():
    """(what, how): each breaks a correct set of manifests in one way the check must catch."""

    def ds_spec(d):
        return find(d, "DaemonSet")["spec"]["template"]["spec"]

    def pod(d):
        return find(d, "Pod")["spec"]

    def mount_socket(d):
        pod(d)["volumes"].append({"name": "sock", "hostPath": {"path": "/run/cuwarden/daemon/cuwardend.sock",
                                                               "type": "Socket"}})
        pod(d)["containers"][0]["volumeMounts"].append({"name": "sock", "mountPath": "/run/cuwardend.sock"})

    def deployment_with_host_pid(d):
        spec = copy.deepcopy(pod(d))
        spec["hostPID"] = True
        d.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "train"},
                  "spec": {"selector": {"matchLabels": {"app": "train"}},
                           "template": {"metadata": {"labels": {"app": "train"}}, "spec": spec}}})

    def annotate(d):
        find(d, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] = True

    return [
        ("selector that matches no template label",
         lambda d: find(d, "DaemonSet")["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "x"})),
        ("no selector", lambda d: find(d, "DaemonSet")["spec"].pop("selector")),
        ("DaemonSet in extensions/v1beta1", lambda d: find(d, "DaemonSet").update({"apiVersion": "extensions/v1beta1"})),
        ("Pod without a name", lambda d: find(d, "Pod")["metadata"].pop("name")),
        ("container without an image", lambda d: pod(d)["containers"][0].pop("image")),
        ("no containers", lambda d: pod(d).update({"containers": []})),
        ("mount of an undeclared volume", lambda d: pod(d)["volumes"].pop(0)),
        ("misspelt field", lambda d: pod(d)["containers"][0].update({"volumeMount": []})),
        ("unquoted annotation", annotate),
        ("port out of range", lambda d: ds_spec(d)["containers"][0]["ports"][0].update({"containerPort": 70000})),
        ("probe on an unknown port name",
         lambda d: ds_spec(d)["containers"][0]["readinessProbe"]["httpGet"].update({"port": "metric"})),
        ("env value not a string", lambda d: pod(d)["containers"][0]["env"].append({"name": "N", "value": 1})),
        ("pod on another run directory", lambda d: pod(d)["volumes"][1]["hostPath"].update({"path": "/tmp/x"})),
        ("workload with hostPID", lambda d: pod(d).update({"hostPID": True})),
        ("workload mounts the node's run directory",
         lambda d: pod(d)["volumes"][1]["hostPath"].update({"path": "/run/cuwarden"})),
        ("workload mounts every pod's directory", lambda d: pod(d)["containers"][0]["volumeMounts"][1].pop("subPathExpr")),
        ("workload mounts another pod's directory",
         lambda d: pod(d)["containers"][0]["volumeMounts"][1].update({"subPathExpr": "$(POD_NAME)"})),
        ("workload mounts the daemon's socket", mount_socket),
        ("Deployment with hostPID", deployment_with_host_pid),
        ("workload as root", lambda d: pod(d)["containers"][0]["securityContext"].update({"runAsUser": 0})),
        ("workload may escalate", lambda d: pod(d)["containers"][0]["securityContext"].pop("allowPrivilegeEscalation")),
        ("workload init step with a capability more",
         lambda d: pod(d)["initContainers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN")),
        ("daemon without hostPID", lambda d: ds_spec(d).pop("hostPID")),
        ("daemon without --pods-dir", lambda d: ds_spec(d)["containers"][0]["command"].__setitem__(3, "--run-dir")),
        ("daemon keeps every capability",
         lambda d: ds_spec(d)["containers"][0]["securityContext"]["capabilities"].pop("drop")),
        ("daemon adds SYS_ADMIN",
         lambda d: ds_spec(d)["containers"][0]["securityContext"]["capabilities"]["add"].append("SYS_ADMIN")),
        ("daemon with a writable root", lambda d: ds_spec(d)["containers"][0]["securityContext"].pop("readOnlyRootFilesystem")),
        ("daemon may escalate",
         lambda d: ds_spec(d)["containers"][0]["securityContext"].update({"allowPrivilegeEscalation": True})),
        ("daemon without seccomp", lambda d: ds_spec(d).pop("securityContext")),
        ("daemon privileged", lambda d: ds_spec(d)["containers"][0]["securityContext"].update({"privileged": True})),
        ("HTTP on 0.0.0.0 without its NetworkPolicy", lambda d: d.remove(find(d, "NetworkPolicy"))),
        ("NetworkPolicy open to every namespace",
         lambda d: find(d, "NetworkPolicy")["spec"]["ingress"][0]["from"][0].update({"namespaceSelector": {}})),
        ("NetworkPolicy that selects other pods",
         lambda d: find(d, "NetworkPolicy")["spec"]["podSelector"].update({"matchLabels": {"app": "x"}})),
        ("ConfigMap missing", lambda d: d.remove(find(d, "ConfigMap"))),
        ("unknown kind", lambda d: d.append({"apiVersion": "v1", "kind": "Podd", "metadata": {"name": "x"}})),
    ]


def main():
    directory = sys.argv[1]
    docs = load(directory)
    errors = check(docs)
    for e in errors:
        print(f"check_manifests: {e}")
    kinds = sorted(d.get("kind") for d in docs)
    if "DaemonSet" not in kinds or "Pod" not in kinds:
        errors.append("expected a DaemonSet and a Pod")
        print(f"check_manifests: expected a DaemonSet and a Pod in {directory} (found {kinds})")
    if "--self-test" in sys.argv[2:] and not errors:
        for what, how in breakages():
            broken = copy.deepcopy(docs)
            how(broken)
            found = check(broken)
            if not found:
                errors.append(what)
                print(f"check_manifests: self-test: '{what}' was not caught")
            else:
                print(f"self-test: {what}: {found[0]}")
    if errors:
        return 1
    print(f"check_manifests: {len(docs)} documents ({', '.join(kinds)}) pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
