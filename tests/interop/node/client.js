#!/usr/bin/env node
/**
 * gRPC's Node.js xDS client (@grpc/grpc-js-xds) driven over a line protocol.
 *
 * The Node counterpart of tests/interop/xds_client_main.py, spawned by
 * tests/interop/test_node_xds_through_relay.py:
 *
 *   GRPC_XDS_BOOTSTRAP_CONFIG='{...}' node tests/interop/node/client.js \
 *       [--target xds:///svc] [--rpc-timeout 5] [--no-wait-for-ready]
 *
 * The bootstrap comes from GRPC_XDS_BOOTSTRAP (a file path) or, when that is unset,
 * GRPC_XDS_BOOTSTRAP_CONFIG (the JSON itself); grpc-js-xds reads these itself.
 *
 * Protocol: once the resolver is registered and the client created (loading grpc-js-xds
 * takes ~1.5 s warm, much longer on a cold disk) it prints {"ready":true}; then, one
 * command per stdin line:
 *   call  -> one unary RPC of /relay.interop.Backend/Identify (empty request, raw
 *            bytes both ways), answered by one JSON line on stdout:
 *              {"seq":0,"ok":true,"backend":"A","elapsed_ms":1.2}
 *              {"seq":1,"ok":false,"code":"UNAVAILABLE","details":"...","elapsed_ms":3.4}
 *   close -> close the channel but keep running (grpc-js-xds then cancels its watches,
 *            which it sends as SotW requests with empty resource_names), answered by
 *            {"closed":true}; a later call fails.
 *   quit  -> close the channel and exit 0 (end of stdin does the same).
 * Commands are handled one at a time, in order. Diagnostics go to stderr only.
 */
'use strict';

const readline = require('node:readline');
const { parseArgs } = require('node:util');
const grpc = require('@grpc/grpc-js');
const grpcXds = require('@grpc/grpc-js-xds');

/** The unary method every interop backend serves (see tests/interop/grpc_xds.py). */
const BACKEND_METHOD = '/relay.interop.Backend/Identify';

/** @param {Buffer} value @returns {Buffer} */
const identity = (value) => value;

/**
 * Read the command line.
 * @returns {{target: string, rpcTimeoutMs: number, waitForReady: boolean}}
 */
function options() {
  const { values } = parseArgs({
    options: {
      target: { type: 'string', default: 'xds:///svc' },
      'rpc-timeout': { type: 'string', default: '5' },
      'no-wait-for-ready': { type: 'boolean', default: false },
    },
  });
  return {
    target: values.target,
    rpcTimeoutMs: Number(values['rpc-timeout']) * 1000,
    waitForReady: !values['no-wait-for-ready'],
  };
}

/**
 * Make one RPC and describe its outcome as a JSON-ready object.
 * @param {grpc.Client} client
 * @param {number} seq
 * @param {{rpcTimeoutMs: number, waitForReady: boolean}} opts
 * @returns {Promise<object>}
 */
function callOnce(client, seq, opts) {
  const start = process.hrtime.bigint();
  const elapsedMs = () => Math.round(Number(process.hrtime.bigint() - start) / 1e4) / 100;
  const metadata = new grpc.Metadata({ waitForReady: opts.waitForReady });
  const deadline = new Date(Date.now() + opts.rpcTimeoutMs);
  return new Promise((resolve) => {
    const fail = (code, details) => resolve({ seq, ok: false, code, details, elapsed_ms: elapsedMs() });
    try {
      client.makeUnaryRequest(
        BACKEND_METHOD, identity, identity, Buffer.alloc(0), metadata, { deadline },
        (err, body) => {
          if (err) {
            fail(grpc.status[err.code] ?? String(err.code), err.details ?? err.message);
          } else {
            resolve({ seq, ok: true, backend: body.toString('utf8'), elapsed_ms: elapsedMs() });
          }
        });
    } catch (err) {
      // e.g. "Channel has been shut down" after close: grpc-js throws instead of failing the call.
      fail('CLIENT_ERROR', String(err && err.message ? err.message : err));
    }
  });
}

/** Register the xds: resolver, then serve stdin commands until quit or EOF. */
async function main() {
  const opts = options();
  grpcXds.register();
  const client = new grpc.Client(opts.target, grpc.credentials.createInsecure());
  const lines = readline.createInterface({ input: process.stdin, terminal: false });
  process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
  let seq = 0;
  for await (const raw of lines) {
    const line = raw.trim();
    if (line === 'quit') {
      break;
    }
    if (line === 'close') {
      client.close();
      process.stdout.write(`${JSON.stringify({ closed: true })}\n`);
      continue;
    }
    if (line !== 'call') {
      process.stderr.write(`client.js: unknown command ${JSON.stringify(line)}\n`);
      continue;
    }
    const result = await callOnce(client, seq, opts);
    seq += 1;
    process.stdout.write(`${JSON.stringify(result)}\n`);
  }
  client.close();
  // The xDS client keeps its ADS stream (and timers) alive; nothing else is pending.
  process.exit(0);
}

main().catch((err) => {
  process.stderr.write(`client.js: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
