'use strict';
// google.protobuf.Duration <-> milliseconds.

function toMillis(duration) {
  if (!duration) return 0;
  return Number(duration.seconds || 0) * 1000 + Math.floor(Number(duration.nanos || 0) / 1e6);
}

function fromMillis(ms) {
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

module.exports = { toMillis, fromMillis };
