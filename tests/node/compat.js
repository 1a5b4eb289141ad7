// Scenarios run with the official RocketMQ 5 Node.js client
// (rocketmq-client-nodejs 1.0.8, unmodified) against a real raftmq cluster.
//
// Driven by tests/node_client.rs, which starts the NameServer and the three
// broker processes, creates the topics and groups, and passes one access
// point (this client joins several into one gRPC target it cannot resolve).
// Each scenario asserts what it checks and exits non-zero on failure. A line
// "@@<action>" on stdout asks the driver to act (for example
// "@@kill-leader"); the driver answers with one line on stdin when done.
//
// Usage: node compat.js SCENARIO --endpoints HOST:PORT --topic T --group G
'use strict';

const readline = require('node:readline');
const { Producer, SimpleConsumer, PushConsumer, ConsumeResult } = require('rocketmq-client-nodejs');

const lines = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();

function log(...args) {
  console.error(...args);
}

async function askDriver(action) {
  process.stdout.write(`@@${action}\n`);
  const { value } = await lines.next();
  log('driver:', action, '->', value);
  return value;
}

function check(cond, what) {
  if (!cond) {
    throw new Error(`check failed: ${what}`);
  }
  log('ok:', what);
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function options(args, extra) {
  return { endpoints: args.endpoints, namespace: '', requestTimeout: 3000, ...extra };
}

function message(topic, body, extra) {
  return { topic, body: Buffer.from(body), ...extra };
}

// Runs `body` with a started Producer of the topic and SimpleConsumer of
// the group, shutting both down however it ends.
async function withClients(args, body) {
  const p = new Producer(options(args, { topic: args.topic }));
  await p.startup();
  const c = new SimpleConsumer(options(args, {
    consumerGroup: args.group,
    subscriptions: new Map([[args.topic, '*']]),
    awaitDuration: 2000,
  }));
  await c.startup();
  try {
    await body(p, c);
  } finally {
    await c.shutdown();
    await p.shutdown();
  }
}

// Receives until every body in `want` arrived (or the deadline); returns the
// messages received, in order. A failed receive fails the scenario unless
// `tolerate` (right after a crash).
async function drain(consumer, want, deadlineMs, { invisibleMs = 15000, ack = true, tolerate = false } = {}) {
  const got = [];
  const seen = new Set();
  const end = Date.now() + deadlineMs;
  while ([...want].some(b => !seen.has(b)) && Date.now() < end) {
    let batch = [];
    try {
      batch = await consumer.receive(32, invisibleMs);
    } catch (e) {
      if (!tolerate) {
        throw e;
      }
      log('receive failed:', e.message);
      await sleep(200);
    }
    for (const m of batch) {
      got.push(m);
      seen.add(m.body.toString());
      if (ack) {
        await consumer.ack(m);
      }
    }
  }
  return got;
}

// Producer and SimpleConsumer: tags and keys arrive as sent, an ack is
// final, and a changed invisible duration brings a message back sooner
// (with its delivery attempt counted).
async function simple(args) {
  await withClients(args, async (p, c) => {
    const sent = new Map();
    for (let i = 0; i < 20; i++) {
      const body = `s${i}`;
      const r = await p.send(message(args.topic, body, { tag: i % 2 ? 'odd' : 'even', keys: [`k${i}`] }));
      check(r.messageId.length > 0, `send ${body} acknowledged with an id`);
      sent.set(body, r.messageId);
    }
    const got = await drain(c, new Set(sent.keys()), 30000);
    // mqadmin's consumerConnection / producerConnection, as raftmq lists them.
    const consumers = await askDriver(`connections ${args.group}`);
    check(/types=SIMPLE_CONSUMER languages=NODE_JS versions=1\.0\.8/.test(consumers), `the consumer is listed: ${consumers}`);
    const producers = await askDriver(`producers ${args.topic}`);
    check(/types=PRODUCER languages=NODE_JS/.test(producers), `the producer is listed: ${producers}`);
    // mqadmin's consumerStatus: its subscription, and what it consumed.
    const status = await askDriver(`status ${args.group}`);
    const counts = /clients=1 subscriptions=(\S+) received=(\d+) acked=(\d+) consistent=true/.exec(status);
    check(counts && counts[1] === `${args.topic}:TAG:*`, `the subscription is listed: ${status}`);
    check(counts && Number(counts[2]) >= 20 && Number(counts[3]) >= 20, `its receives and acks are counted: ${status}`);
    const bodies = new Set(got.map(m => m.body.toString()));
    check([...sent.keys()].every(b => bodies.has(b)), 'every sent message received');
    const s3 = got.find(m => m.body.toString() === 's3');
    check(s3.tag === 'odd' && s3.keys.includes('k3') && s3.messageId === sent.get('s3'), 'tag, keys and id as sent');

    await p.send(message(args.topic, 'later'));
    const [first] = await drain(c, new Set(['later']), 20000, { invisibleMs: 30000, ack: false });
    check(first && first.body.toString() === 'later', 'the message to re-time arrives');
    await c.changeInvisibleDuration(first, 1000);
    const started = Date.now();
    const again = await drain(c, new Set(['later']), 15000, { invisibleMs: 30000, ack: false });
    const back = again.find(m => m.body.toString() === 'later');
    check(back && Date.now() - started < 12000, 'a shortened invisible duration brings it back early');
    check(back.deliveryAttempt === 2, `counted as the second delivery (${back.deliveryAttempt})`);
    await c.ack(back);
    const none = await drain(c, new Set(['later']), 4000);
    check(none.length === 0, 'an acknowledged message is not delivered again');
  });
}

// PushConsumer: the listener gets every message; a failed one is retried.
async function push(args) {
  const p = new Producer(options(args, { topic: args.topic }));
  await p.startup();
  const seen = new Map();
  const c = new PushConsumer(options(args, {
    consumerGroup: args.group,
    subscriptions: new Map([[args.topic, '*']]),
    messageListener: {
      async consume(m) {
        const body = m.body.toString();
        seen.set(body, (seen.get(body) || 0) + 1);
        // The first delivery of p0 fails: it must come again.
        return body === 'p0' && seen.get(body) === 1 ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  }));
  await c.startup();
  try {
    const want = [];
    for (let i = 0; i < 20; i++) {
      await p.send(message(args.topic, `p${i}`));
      want.push(`p${i}`);
    }
    const end = Date.now() + 60000;
    while ((!want.every(b => seen.has(b)) || (seen.get('p0') || 0) < 2) && Date.now() < end) {
      await sleep(200);
    }
    check(want.every(b => seen.has(b)), 'the listener got every message');
    check(seen.get('p0') >= 2, 'a failed consumption is delivered again');
  } finally {
    await c.shutdown();
    await p.shutdown();
  }
}

// FIFO: a FIFO group receives each message group's messages in send order.
async function fifo(args) {
  await withClients(args, async (p, c) => {
    const want = new Set();
    for (let i = 0; i < 10; i++) {
      for (const g of ['a', 'b', 'c']) {
        await p.send(message(args.topic, `${g}${i}`, { messageGroup: `order-${g}` }));
        want.add(`${g}${i}`);
      }
    }
    const got = await drain(c, want, 60000);
    for (const g of ['a', 'b', 'c']) {
      const order = got.filter(m => m.messageGroup === `order-${g}`).map(m => Number(m.body.toString().slice(1)));
      check(order.length === 10 && order.every((n, i) => n === i), `group order-${g} in send order: ${order}`);
    }
  });
}

// Sends through a leader crash: every acknowledged message is received.
async function failover(args) {
  await withClients(args, async (p, c) => {
    const acked = [];
    let failed = 0;
    for (let i = 0; i < 120; i++) {
      if (i === 30) {
        await askDriver('kill-leader');
      }
      try {
        await p.send(message(args.topic, `f${i}`));
        acked.push(`f${i}`);
      } catch (e) {
        failed += 1;
        log(`send f${i} failed: ${e.message}`);
      }
      await sleep(50);
    }
    log(`acked ${acked.length}, failed ${failed}`);
    check(acked.length >= 100, 'at least 100 of 120 sends acknowledged across the crash');
    const got = await drain(c, new Set(acked), 60000, { invisibleMs: 30000, tolerate: true });
    const bodies = new Set(got.map(m => m.body.toString()));
    const missing = acked.filter(b => !bodies.has(b));
    check(missing.length === 0, `every acknowledged message received after the crash (missing ${missing})`);
    process.stdout.write(`${JSON.stringify({ acked: acked.length, failed })}\n`);
  });
}

async function main() {
  const [scenario, ...rest] = process.argv.slice(2);
  const args = {};
  for (let i = 0; i + 1 < rest.length; i += 2) {
    args[rest[i].replace(/^--/, '')] = rest[i + 1];
  }
  const run = { simple, push, fifo, failover }[scenario];
  if (!run || !args.endpoints || !args.topic || !args.group) {
    throw new Error('usage: compat.js simple|push|fifo|failover --endpoints E --topic T --group G');
  }
  await run(args);
  log(`scenario ${scenario} passed`);
}

main().then(
  () => process.exit(0),
  e => {
    log(e && e.stack ? e.stack : e);
    process.exit(1);
  },
);
