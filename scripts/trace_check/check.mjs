// Parse a Trace Event Format file with the Chrome DevTools performance panel's trace
// engine (@paulirish/trace_engine, pinned in package-lock.json) and print what it made
// of it as one JSON object:
//
//   events     the events the engine read
//   bounds     the trace's bounds {min, max} in microseconds, as the panel shows them
//   processes  {pid: name} from the process_name metadata
//   threads    [{pid, tid, name, slices, dropped}]: every thread the engine named or
//              drew; slices are the complete events in its tree, dropped those it read
//              but left out of the tree (a slice that crosses another one)
//   error      null, or why the engine could not parse the file (or found no
//              bounds: it reads a ts that is not a number as NaN and goes on)
//
// The exit status is 1 if there is an error or a dropped slice. Run it through
// scripts/trace_check.sh, which installs the engine beside this file.
//
//   node check.mjs TRACE.json
import fs from 'node:fs';

import * as Trace from '@paulirish/trace_engine';

function threadsOf(data) {
  const byKey = new Map();
  const thread = (pid, tid) => {
    const key = `${pid}/${tid}`;
    if (!byKey.has(key)) {
      byKey.set(key, { pid, tid, name: null, slices: 0, dropped: 0 });
    }
    return byKey.get(key);
  };
  for (const [pid, threads] of data.Meta.threadsInProcess) {
    for (const [tid, event] of threads) {
      thread(pid, tid).name = event.args?.name ?? null;
    }
  }
  const { entryToNode } = data.Renderer;
  for (const [pid, process] of data.Renderer.processes) {
    for (const [tid, drawn] of process.threads) {
      const entry = thread(pid, tid);
      for (const event of drawn.entries) {
        if (entryToNode.has(event)) {
          entry.slices += 1;
        } else {
          entry.dropped += 1;
        }
      }
    }
  }
  return [...byKey.values()].sort((a, b) => a.pid - b.pid || a.tid - b.tid);
}

async function check(path) {
  const summary = { events: 0, bounds: null, processes: {}, threads: [], error: null };
  try {
    const document = JSON.parse(fs.readFileSync(path, 'utf8'));
    const events = Array.isArray(document) ? document : document.traceEvents;
    if (!Array.isArray(events)) {
      throw new Error('no traceEvents array');
    }
    const model = Trace.TraceModel.Model.createWithAllHandlers();
    await model.parse(events);
    const parsed = model.parsedTrace(0);
    if (!parsed) {
      throw new Error('the engine kept no parsed trace');
    }
    const { data } = parsed;
    summary.events = parsed.traceEvents.length;
    const { min, max } = data.Meta.traceBounds;
    summary.bounds = { min, max };
    if (!Number.isFinite(min) || !Number.isFinite(max)) {
      // The engine takes a ts it cannot read (a string, say) as NaN and carries on.
      throw new Error(`the trace's bounds are not numbers: ${min}..${max}`);
    }
    for (const [pid, event] of data.Meta.processNames) {
      summary.processes[pid] = event.args?.name ?? null;
    }
    summary.threads = threadsOf(data);
  } catch (error) {
    summary.error = String(error?.stack ?? error);
  }
  return summary;
}

const path = process.argv[2];
if (!path) {
  console.error('usage: node check.mjs TRACE.json');
  process.exit(2);
}
const summary = await check(path);
console.log(JSON.stringify(summary, null, 1));
const dropped = summary.threads.some((t) => t.dropped > 0);
process.exit(summary.error !== null || dropped ? 1 : 0);
