// Validates Kubernetes manifests offline against the Kubernetes schemas of the
// npm package `kubernetes-models` (types and required fields).
// Usage: node deploy/validate.mjs NODE_MODULES_DIR FILE.yaml...
// Prints one line per object; exits 1 if any object is invalid. Kubeflow's
// MXJob is not in those schemas: its own shape is checked here and each
// replica's pod template is validated as a core/v1 PodTemplate.
import path from "node:path";
import fs from "node:fs";
import { pathToFileURL } from "node:url";

const [modules, ...files] = process.argv.slice(2);
const load = (rel) => import(pathToFileURL(path.join(modules, rel)).href);
const YAML = (await load("yaml/dist/index.js")).default ?? (await load("yaml/dist/index.js"));

async function modelFor(apiVersion, kind) {
  const dir = apiVersion.includes("/") ? apiVersion : `v1`;  // core group lives under v1/
  const file = path.join("kubernetes-models", dir, `${kind}.js`);
  if (!fs.existsSync(path.join(modules, file))) throw new Error(`no schema for ${apiVersion} ${kind}`);
  return (await load(file))[kind];
}

function checkMxJob(obj) {
  const spec = obj.spec ?? {};
  if (spec.jobMode !== "MXTrain") throw new Error("spec.jobMode must be MXTrain");
  const replicas = spec.mxReplicaSpecs ?? {};
  for (const role of ["Scheduler", "Server", "Worker"]) {
    const r = replicas[role];
    if (!r) throw new Error(`spec.mxReplicaSpecs.${role} missing`);
    if (!Number.isInteger(r.replicas) || r.replicas < 1) throw new Error(`${role}.replicas must be a positive integer`);
    if (!r.template) throw new Error(`${role}.template missing`);
    const containers = r.template.spec?.containers ?? [];
    if (!containers.some((c) => c.name === "mxnet")) throw new Error(`${role}: the operator expects a container named mxnet`);
  }
  if (replicas.Scheduler.replicas !== 1) throw new Error("Scheduler.replicas must be 1");
  return Object.entries(replicas).map(([role, r]) => [role, { metadata: { name: `${obj.metadata.name}-${role}` }, template: r.template }]);
}

let failed = 0;
for (const file of files) {
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    const obj = doc.toJS();
    if (!obj) continue;
    const what = `${path.basename(file)}: ${obj.kind}/${obj.metadata?.name}`;
    try {
      if (doc.errors.length) throw new Error(doc.errors[0].message);
      if (obj.apiVersion === "kubeflow.org/v1" && obj.kind === "MXJob") {
        const PodTemplate = await modelFor("v1", "PodTemplate");
        for (const [role, t] of checkMxJob(obj)) {
          try { new PodTemplate(t).validate(); } catch (e) { throw new Error(`${role} template: ${e.message}`); }
        }
      } else {
        const Model = await modelFor(obj.apiVersion, obj.kind);
        new Model(obj).validate();
      }
      console.log(`valid    ${what}`);
    } catch (e) {
      failed++;
      console.log(`INVALID  ${what}: ${String(e.message).split("\n").slice(0, 6).join(" | ")}`);
    }
  }
}
process.exit(failed ? 1 : 0);
