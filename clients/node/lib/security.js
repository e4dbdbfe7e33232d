'use strict';
// How a Node client reaches lowtide, as the Python client and the CLI do: plaintext or TLS
// (`ca`), mutual TLS (`cert` and `key` as well), and a bearer token sent with every call
// (`token`). Each of ca, cert and key is PEM text, a Buffer, or the path of a PEM file.
// `fromEnv()` reads LOWTIDE_TOKEN, LOWTIDE_CA, LOWTIDE_CERT and LOWTIDE_KEY.
const fs = require('node:fs');
const grpc = require('@grpc/grpc-js');

function pem(value, name) {
  if (value === undefined || value === null || value === '') return null;
  if (Buffer.isBuffer(value)) return value;
  if (typeof value !== 'string') throw new TypeError(`${name} must be PEM text, a Buffer or a file path`);
  return value.includes('-----BEGIN') ? Buffer.from(value) : fs.readFileSync(value);
}

// grpc-js sends call credentials only over TLS; an interceptor adds the token on either.
function bearer(token) {
  return (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set('authorization', `Bearer ${token}`);
        next(metadata, listener);
      },
    });
}

// Keepalive, as lowtide_client's channels: a ping every 30 s while a call is open, and a
// connection that does not answer within 10 s is given up (the stream fails UNAVAILABLE and the
// worker reconnects) instead of hanging on a half-open connection. The services allow a ping
// every 10 s on a silent connection.
const KEEPALIVE = {
  'grpc.keepalive_time_ms': 30000,
  'grpc.keepalive_timeout_ms': 10000,
  'grpc.keepalive_permit_without_calls': 0,
};

/** The channel credentials and client options for these settings. */
function channelSettings({ token, ca, cert, key } = {}) {
  const caPem = pem(ca, 'ca');
  const certPem = pem(cert, 'cert');
  const keyPem = pem(key, 'key');
  if ((certPem === null) !== (keyPem === null)) throw new Error('cert and key go together (mutual TLS)');
  if (certPem !== null && caPem === null) throw new Error('a client certificate needs ca (TLS) as well');
  const credentials = caPem ? grpc.credentials.createSsl(caPem, keyPem, certPem) : grpc.credentials.createInsecure();
  return { credentials, options: token ? { ...KEEPALIVE, interceptors: [bearer(token)] } : { ...KEEPALIVE } };
}

/** Token and TLS files from the environment, the names the lowtide CLI reads. */
function fromEnv(env = process.env) {
  return {
    token: env.LOWTIDE_TOKEN || undefined,
    ca: env.LOWTIDE_CA || undefined,
    cert: env.LOWTIDE_CERT || undefined,
    key: env.LOWTIDE_KEY || undefined,
  };
}

module.exports = { channelSettings, fromEnv };
