// Echo server for pyconcbench (implementation node_net): net.createServer on an inherited
// listening socket, TCP or UNIX, one process, no cluster, as in uvloop's echo study.
//
//   node echo.js [BACKLOG] [FD]    serve the listening socket on descriptor FD (default 3)
//
// Node calls listen() again on the descriptor it is given, with BACKLOG (default 511).
// A connection whose write buffer is full (write() returned false) is paused until 'drain',
// so a client that does not read cannot make the server buffer without bound.
// It prints READY on stdout once it serves, its stop handlers in place.  On SIGTERM, SIGINT or
// SIGHUP it stops accepting, destroys every connection, prints
// {"accepted": N, "bytes": N, "errors": N} on stdout and exits 0.  Bytes are counted when
// read, before they are written back.
'use strict';

const fs = require('fs');
const net = require('net');

function intArg(index, fallback) {
  const text = process.argv[index];
  if (text === undefined) return fallback;
  const value = Number(text);
  if (!Number.isInteger(value) || value < 0) {
    process.stderr.write('echo.js: not a non-negative integer: ' + JSON.stringify(text) + '\n');
    process.exit(2);
  }
  return value;
}

const backlog = intArg(2, 511);
const fd = intArg(3, 3);
// Errors that end a connection normally: a reset or broken pipe from the client.
const QUIET = new Set(['ECONNRESET', 'EPIPE']);
const counts = { accepted: 0, bytes: 0, errors: 0 };
const sockets = new Set();

const server = net.createServer((socket) => {
  counts.accepted += 1;
  sockets.add(socket);
  socket.setNoDelay(true); // a no-op on UNIX sockets
  socket.on('data', (chunk) => {
    counts.bytes += chunk.length;
    if (!socket.write(chunk)) socket.pause();
  });
  socket.on('drain', () => socket.resume());
  socket.on('error', (err) => {
    if (!QUIET.has(err.code)) counts.errors += 1;
  });
  socket.on('close', () => sockets.delete(socket));
});

// Accept errors (EMFILE and the like) are emitted here; libuv keeps accepting afterwards.
server.on('error', (err) => {
  counts.errors += 1;
  if (!server.listening) {
    process.stderr.write('echo.js: cannot listen on fd ' + fd + ': ' + err.message + '\n');
    process.exit(2);
  }
});

function stop() {
  server.close();
  for (const socket of sockets) socket.destroy();
  try {
    fs.writeSync(1, JSON.stringify(counts) + '\n');
  } catch (err) {
    // the launcher is gone already
  }
  process.exit(0);
}

process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.on('SIGHUP', stop);
// With a descriptor, Node takes the backlog from the second argument only, not from options.
server.listen({ fd: fd }, backlog, () => fs.writeSync(1, 'READY\n'));
