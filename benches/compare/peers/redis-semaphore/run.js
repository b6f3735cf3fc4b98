// The npm `redis-semaphore` peer of benches/compare/kinds.rs.
//   node run.js <redis url> <key> <permits> <tasks> <cycles>
// Connects, warms up (200 cycles), prints "ready", waits for a line on stdin (the bench
// reads Redis' counters in between), runs <cycles> acquire + release cycles
// from <tasks> concurrent loops on one ioredis connection, then prints one
// JSON line: {"per_s", "p50_us", "p99_us"}. Library defaults (a waiting
// acquire polls every 10 ms).
'use strict';
const Redis = require('ioredis');
const { Semaphore } = require('redis-semaphore');

async function main() {
  const [url, key, permits, tasks, cycles] = process.argv.slice(2);
  const limit = Number(permits);
  const client = new Redis(url);
  const cycle = async () => {
    const s = new Semaphore(client, key, limit);
    await s.acquire();
    await s.release();
  };
  for (let i = 0; i < 200; i++) await cycle();
  process.stdout.write('ready\n');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  let left = Number(cycles);
  const lat = [];
  const start = process.hrtime.bigint();
  const loop = async () => {
    while (left > 0) {
      left -= 1;
      const t = process.hrtime.bigint();
      await cycle();
      lat.push(Number(process.hrtime.bigint() - t) / 1e3);
    }
  };
  await Promise.all(Array.from({ length: Number(tasks) }, loop));
  const secs = Number(process.hrtime.bigint() - start) / 1e9;
  lat.sort((a, b) => a - b);
  const pct = (p) => lat[Math.floor((lat.length - 1) * p)];
  process.stdout.write(
    JSON.stringify({ per_s: Number(cycles) / secs, p50_us: pct(0.5), p99_us: pct(0.99) }) + '\n',
  );
  client.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
