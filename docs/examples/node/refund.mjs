// A Node.js service using agentrt with nothing but proto/ and the docs (docs/api.md, docs/events/):
// submit a run (idempotent by client_request_id), wait until it asks for approval, approve it
// (idempotent by request_id), wait until it completes, then consume the run's events from Kafka
// with exactly-once effects: each event's effect and its ce_id commit in one PostgreSQL transaction.
//
//   AGENTRT_ADDR=127.0.0.1:50051 AGENTRT_TENANT=acme KAFKA_BOOTSTRAP=127.0.0.1:9092 \
//   DATABASE_URL=postgresql://postgres@127.0.0.1:5432/shop node refund.mjs
//
// Optional: AGENTRT_API_KEY (sent as `authorization: Bearer …`), AGENTRT_AGENT (default "refunds"),
// KAFKA_TOPIC (default "agentrt.events"), CONSUMER_NAME (the dedupe identity, default "shop-refunds"),
// PROTO_DIR (default: the repository's proto/), ORDER_ID. Prints one JSON line per step.

import { randomUUID } from "node:crypto";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { existsSync } from "node:fs";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import kafkajs from "kafkajs";
import pg from "pg";

const env = process.env;
const here = dirname(fileURLToPath(import.meta.url));
const protoDir = env.PROTO_DIR ?? join(here, "..", "..", "..", "proto");
const tenant = env.AGENTRT_TENANT ?? "acme";
const agent = env.AGENTRT_AGENT ?? "refunds";
const topic = env.KAFKA_TOPIC ?? "agentrt.events";
const consumerName = env.CONSUMER_NAME ?? "shop-refunds";
const say = (what, fields = {}) => console.log(JSON.stringify({ step: what, ...fields }));

// --- gRPC: load the .proto files at run time (no generated code needed) -------------------------
const loaderOptions = { keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
                        includeDirs: [protoDir] };
const api = grpc.loadPackageDefinition(
  protoLoader.loadSync(["agentrt/v1/run_service.proto"], loaderOptions)).agentrt.v1;
const runs = new api.RunService(env.AGENTRT_ADDR ?? "127.0.0.1:50051", grpc.credentials.createInsecure());

function metadata() {
  const md = new grpc.Metadata();
  md.set("x-tenant-id", tenant);
  if (env.AGENTRT_API_KEY) md.set("authorization", `Bearer ${env.AGENTRT_API_KEY}`);
  return md;
}

// The ErrorInfo of a failed call: a google.rpc.Status in the grpc-status-details-bin trailer, whose
// details hold a google.rpc.ErrorInfo (domain "agentrt.dev", reason e.g. "ALREADY_EXISTS").
function errorReason(error) {
  const raw = error?.metadata?.get("grpc-status-details-bin")?.[0];
  return raw ? decodeErrorInfo(raw) : null;
}

let protobufRoot = null;
function decodeErrorInfo(raw) {
  if (protobufRoot === null) return null;
  const Status = protobufRoot.lookupType("google.rpc.Status");
  const ErrorInfo = protobufRoot.lookupType("google.rpc.ErrorInfo");
  const status = Status.decode(raw);
  for (const detail of status.details ?? []) {
    if (detail.type_url === "type.googleapis.com/google.rpc.ErrorInfo") {
      return ErrorInfo.decode(detail.value);
    }
  }
  return null;
}

// Every call with a deadline; UNAVAILABLE is retried (the same request id makes the retry safe).
async function call(method, request, { attempts = 5, deadlineMs = 10_000 } = {}) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await new Promise((resolve, reject) => {
        runs[method](request, metadata(), { deadline: Date.now() + deadlineMs },
                     (error, reply) => (error ? reject(error) : resolve(reply)));
      });
    } catch (error) {
      const retryable = error.code === grpc.status.UNAVAILABLE || error.code === grpc.status.DEADLINE_EXCEEDED;
      if (!retryable || attempt >= attempts) {
        error.reason = errorReason(error)?.reason ?? null;
        throw error;
      }
      await new Promise((r) => setTimeout(r, 200 * 2 ** attempt));
    }
  }
}

async function waitFor(runId, statuses, timeoutMs = 60_000) {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const run = await call("GetRun", { run_id: runId });
    if (statuses.includes(run.status)) return run;
    if (Date.now() > until) throw new Error(`run ${runId} is ${run.status}, not ${statuses.join("|")}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

// --- Kafka: exactly-once effects with a dedupe table ----------------------------------------------
async function consumeRunEvents(runId, timeoutMs = 60_000) {
  const db = new pg.Client({ connectionString: env.DATABASE_URL });
  await db.connect();
  await db.query(`CREATE TABLE IF NOT EXISTS consumed_agent_events (
                    consumer text NOT NULL, event_id uuid NOT NULL, PRIMARY KEY (consumer, event_id))`);
  await db.query(`CREATE TABLE IF NOT EXISTS refund_effects (
                    run_id uuid NOT NULL, event_type text NOT NULL, sequence text NOT NULL,
                    PRIMARY KEY (run_id, sequence))`);
  const kafka = new kafkajs.Kafka({ clientId: consumerName, brokers: [env.KAFKA_BOOTSTRAP],
                                    logLevel: kafkajs.logLevel.NOTHING });
  const consumer = kafka.consumer({ groupId: `${consumerName}-${randomUUID()}` });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let applied = 0;
  let skipped = 0;
  let completed = false;
  const header = (message, name) => message.headers?.[name]?.toString();
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ topic: from, partition, message }) => {
      // Binary-mode CloudEvents: attributes are ce_* headers, the value is the JSON payload.
      const event = { id: header(message, "ce_id"), type: header(message, "ce_type"),
                      subject: header(message, "ce_subject"), sequence: header(message, "ce_sequence") };
      if (event.subject === runId) {
        // The effect and the event id commit together: a redelivered event finds its id and does nothing.
        await db.query("BEGIN");
        try {
          const fresh = await db.query(
            "INSERT INTO consumed_agent_events (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            [consumerName, event.id]);
          if (fresh.rowCount === 1) {
            await db.query("INSERT INTO refund_effects (run_id, event_type, sequence) VALUES ($1, $2, $3)",
                           [runId, event.type, event.sequence]);
            applied++;
          } else {
            skipped++;
          }
          await db.query("COMMIT");
        } catch (error) {
          await db.query("ROLLBACK");
          throw error; // not committed: Kafka redelivers it
        }
        if (event.type === "agent.run_completed") completed = true;
      }
      // The offset after the effect: a crash between the two redelivers, and the dedupe skips it.
      await consumer.commitOffsets([{ topic: from, partition, offset: (BigInt(message.offset) + 1n).toString() }]);
    },
  });
  const until = Date.now() + timeoutMs;
  while (!completed && Date.now() < until) await new Promise((r) => setTimeout(r, 100));
  await consumer.disconnect();
  await db.end();
  if (!completed) throw new Error("agent.run_completed of the run was not consumed in time");
  return { applied, skipped };
}

// --- the flow --------------------------------------------------------------------------------------
async function main() {
  try {
    const { default: protobuf } = await import("protobufjs");
    if (existsSync(join(protoDir, "google/rpc/status.proto"))) {
      protobufRoot = new protobuf.Root();
      protobufRoot.resolvePath = (_origin, target) => join(protoDir, target);
      protobufRoot.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"]);
    }
  } catch {
    protobufRoot = null; // error details stay undecoded; codes still work
  }

  const consumeOnly = process.argv.includes("--consume-only");
  if (consumeOnly) {
    const runId = process.argv[process.argv.indexOf("--consume-only") + 1];
    say("consumed", { run_id: runId, ...(await consumeRunEvents(runId)) });
    return;
  }

  // 1. Submit. The client_request_id makes the call safe to retry: the same id and input answer
  //    the same run (created=false); the same id with another input is ALREADY_EXISTS.
  const clientRequestId = `order-${env.ORDER_ID ?? randomUUID()}`;
  const input = JSON.stringify({ order_id: 4711, amount: 80 }); // JSON.stringify writes 80, never 80.0
  const submit = { agent_name: agent, input_json: input, client_request_id: clientRequestId };
  const first = await call("SubmitRun", submit);
  const again = await call("SubmitRun", submit);
  say("submitted", { run_id: first.run.run_id, created: first.created, retry_created: again.created,
                     same_run: again.run.run_id === first.run.run_id });
  try {
    await call("SubmitRun", { ...submit, input_json: JSON.stringify({ order_id: 4711, amount: 81 }) });
    say("conflict", { reason: "none" });
  } catch (error) {
    say("conflict", { code: grpc.status[error.code], reason: error.reason });
  }

  // 2. Wait until it needs a person, then approve. ResumeRun's request_id makes a retry safe.
  const runId = first.run.run_id;
  const paused = await waitFor(runId, ["RUN_STATUS_PAUSED_HUMAN"]);
  say("paused", { status: paused.status, pause_reason: paused.pause_reason });
  const approve = { run_id: runId, decision: "RESUME_DECISION_APPROVE", comment: "refund ok",
                    request_id: `approve-${clientRequestId}` };
  await call("ResumeRun", approve);
  const retried = await call("ResumeRun", approve);
  say("approved", { status_after_retry: retried.status });

  // 3. Wait for the end.
  const done = await waitFor(runId, ["RUN_STATUS_COMPLETED", "RUN_STATUS_FAILED", "RUN_STATUS_CANCELLED"]);
  say("finished", { status: done.status, result: done.result_json ? JSON.parse(done.result_json) : null });

  // 4. Its events, each effect applied exactly once.
  say("consumed", { run_id: runId, ...(await consumeRunEvents(runId)) });
}

main().then(
  () => process.exit(0),
  (error) => {
    console.error(`refund.mjs: ${error.message}${error.reason ? ` (${error.reason})` : ""}`);
    process.exit(1);
  });
