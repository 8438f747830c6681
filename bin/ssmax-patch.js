#!/usr/bin/env node
'use strict';
const fs = require('node:fs');
const path = require('node:path');

// The package ships dist/; a checkout of the repository builds it with `npm run build` (npm test does too).
if (!fs.existsSync(path.join(__dirname, '../dist/src/cli/main.js'))) {
  process.stderr.write(`ssmax-patch: not built: run npm run build in ${path.resolve(__dirname, '..')}\n`);
  process.exit(2);
}
const { main } = require('../dist/src/cli/main.js');
const { relaunchForVerify } = require('../dist/src/cli/relaunch.js');

relaunchForVerify(__filename, process.argv.slice(2))
  .then((code) => (code === null ? main(process.argv.slice(2)) : code))
  .then((code) => {
    process.exitCode = code;
  });
