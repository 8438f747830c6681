#!/usr/bin/env node
'use strict';
const { main } = require('../dist/src/cli/main.js');
const { relaunchForVerify } = require('../dist/src/cli/relaunch.js');

relaunchForVerify(__filename, process.argv.slice(2))
  .then((code) => (code === null ? main(process.argv.slice(2)) : code))
  .then((code) => {
    process.exitCode = code;
  });
