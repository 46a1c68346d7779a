#!/usr/bin/env python3
"""The Kubernetes manifests (cluster/kubernetes/*.yaml) against the required fields of their API
versions (v1 Namespace, ConfigMap and Pod, apps/v1 DaemonSet), without a cluster: names,
selectors that match their template's labels, containers with a name and an image, mounts
that name declared volumes, string-valued labels and annotations, ports in range, and the
fields a typo would misspell. Then cuwarden's own wiring: the daemon and every pod mount one
node run directory, and LD_PRELOAD names a file under a mounted volume.

    check_manifests.py DIR              check every *.yaml in DIR
    check_manifests.py DIR --self-test  also check that each of a list of breakages is caught
"""
import copy
import pathlib
import re
import sys

import yaml

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
KINDS = {"Namespace": "v1", "ConfigMap": "v1", "Pod": "v1", "DaemonSet": "apps/v1"}

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
            if m.get("name") not in volumes:
                self.fail(f"{where}.volumeMounts[{i}]", f"name {m.get('name')!r} is not a volume of the pod")
            if not isinstance(m.get("mountPath"), str) or not m["mountPath"].startswith("/"):
                self.fail(f"{where}.volumeMounts[{i}]", f"mountPath: required, absolute (got {m.get('mountPath')!r})")
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
        elif kind == "DaemonSet":
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


def pod_specs(docs):
    for doc in docs:
        if doc.get("kind") == "Pod":
            yield doc["metadata"]["name"], doc.get("spec") or {}
        elif doc.get("kind") == "DaemonSet":
            yield doc["metadata"]["name"], ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}


def mounted_host_path(spec, container, path):
    """The hostPath under which `path` lies in `container`, or None."""
    volumes = {v.get("name"): v for v in spec.get("volumes") or [] if isinstance(v, dict)}
    for m in container.get("volumeMounts") or []:
        mp = m.get("mountPath", "").rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            hp = (volumes.get(m.get("name")) or {}).get("hostPath")
            return hp.get("path") if hp else "(not a hostPath)"
    return None


def wiring(ck, docs):
    """cuwarden's own: one node run directory for the daemon and every interposed container."""
    config_maps = {d["metadata"]["name"] for d in docs if d.get("kind") == "ConfigMap"}
    daemon_run = None
    for name, spec in pod_specs(docs):
        for c in spec.get("containers") or []:
            cmd = list(c.get("command") or []) + list(c.get("args") or [])
            if cmd and cmd[0] == "cuwardend":
                if "--run-dir" not in cmd or "--http" not in cmd:
                    ck.fail(name, "cuwardend needs --run-dir (the node's) and --http (for Prometheus)")
                    continue
                if not cmd[cmd.index("--http") + 1].startswith("0.0.0.0:"):
                    ck.fail(name, "cuwardend --http must listen on 0.0.0.0 for Prometheus to reach it")
                daemon_run = mounted_host_path(spec, c, cmd[cmd.index("--run-dir") + 1])
                if daemon_run in (None, "(not a hostPath)"):
                    ck.fail(name, "cuwardend's --run-dir must lie on a hostPath volume")
    for name, spec in pod_specs(docs):
        for v in spec.get("volumes") or []:
            cm = (v.get("configMap") or {}).get("name")
            if cm and cm not in config_maps:
                ck.fail(name, f"volume {v.get('name')!r} names ConfigMap {cm!r}, which no manifest defines")
        for c in spec.get("containers") or []:
            env = {e.get("name"): e.get("value") for e in c.get("env") or [] if isinstance(e, dict)}
            if "LD_PRELOAD" not in env:
                continue
            if mounted_host_path(spec, c, env["LD_PRELOAD"] or "") is None:
                ck.fail(name, f"LD_PRELOAD={env['LD_PRELOAD']} lies on no mounted volume")
            run = env.get("CUWARDEN_RUN_DIR")
            if not run:
                ck.fail(name, "an interposed container needs CUWARDEN_RUN_DIR (its /dev/shm is the pod's own)")
            elif daemon_run and (host := mounted_host_path(spec, c, run)) != daemon_run:
                ck.fail(name, f"CUWARDEN_RUN_DIR={run} lies on the node's {host}, not on the daemon's run "
                              f"directory {daemon_run}")


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
        ("daemon on loopback only", lambda d: ds_spec(d)["containers"][0]["command"].__setitem__(4, "127.0.0.1:9477")),
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
