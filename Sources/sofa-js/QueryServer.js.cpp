// The JavaScript half of sofa-js: CouchDB's query-server protocol, as CouchDB's
// "Query Server Protocol" documentation describes it. Kept as a C++ raw string so the
// binary carries it; edit it as JavaScript.
extern const char sofaQueryServerScript[] = R"JS(
"use strict";
(function (global) {
  // The host's two functions, taken away from design-document code.
  const readLine = global.readline, printLine = global.print;
  delete global.readline;
  delete global.print;

  let config = {}, mapFunctions = [], library = {}, emitted = null;
  let listing = null;   // the list function running: { chunks, head, started, lastRow }
  const designDocuments = new Map();   // id -> { body, compiled: Map(path -> function) }

  function respond(value) { printLine(JSON.stringify(value)); }
  function log(message) {
    respond(["log", typeof message === "string" ? message : JSON.stringify(message)]);
  }

  class ProtocolError extends Error {
    constructor(error, reason) { super(reason); this.error = error; this.reason = reason; }
  }

  // What design-document functions may call, as in CouchDB.
  const helpers = {
    emit(key, value) {
      if (emitted === null) throw new ProtocolError("invalid_call", "emit() is only for map functions");
      emitted.push([key === undefined ? null : key, value === undefined ? null : value]);
    },
    log,
    sum(values) { let total = 0; for (const value of values) total += value; return total; },
    isArray: Array.isArray,
    toJSON: JSON.stringify,
    // List functions' side of the protocol, as CouchDB's render.js: `start` sets the response
    // head, `send` adds to the body, `getRow` hands over what was sent and asks for a row.
    start(head) { if (listing) listing.head = mime.withType(head || {}); },
    send(chunk) { if (listing) listing.chunks.push(String(chunk)); },
    getRow() {
      if (!listing) throw new ProtocolError("invalid_call", "getRow() is only for list functions");
      if (listing.lastRow) return null;
      if (!listing.started) {
        listing.started = true;
        respond(["start", listing.chunks, listing.head || {}]);
      } else {
        respond(["chunks", listing.chunks]);
      }
      listing.chunks = [];
      const line = readLine();
      if (line === null) throw new ProtocolError("list_error", "the list ended before its rows");
      const message = JSON.parse(line);
      if (message[0] === "list_end") { listing.lastRow = true; return null; }
      if (message[0] !== "list_row") throw new ProtocolError("list_error", "expected a row, got " + message[0]);
      return message[1];
    },
  };
  // Content negotiation for shows and lists, as CouchDB's render.js: `registerType(key,
  // mime…)` names types, `provides(key, fun)` offers a rendering; after the function, the one
  // asked for by `?format=KEY`, else the best match of the Accept header, else the first
  // offered, runs, and its type becomes the answer's Content-Type.
  const mime = {
    byKey: new Map(), keyByType: new Map(), offered: [], chosenType: null,
    register(key, ...types) {
      mime.byKey.set(key, types);
      for (const type of types) mime.keyByType.set(type, key);
    },
    reset() { mime.offered = []; mime.chosenType = null; },
    // One media range of an Accept header: [type, subtype, parameters].
    parseRange(text) {
      const [full, ...parameters] = text.split(";");
      const params = {};
      for (const parameter of parameters) {
        const equals = parameter.indexOf("=");
        if (equals > 0) params[parameter.slice(0, equals).trim()] = parameter.slice(equals + 1).trim();
      }
      let [type, subtype] = full.trim().split("/");
      if (full.trim() === "*") { type = "*"; subtype = "*"; }
      const q = parseFloat(params.q);
      params.q = !isNaN(q) && q >= 0 && q <= 1 ? params.q : "1";
      return [type, subtype, params];
    },
    // How well `type` fits the ranges: [fitness, quality] of its best-fitting range.
    fitness(type, ranges) {
      const [target, subtarget, targetParams] = mime.parseRange(type);
      let best = -1, quality = 0;
      for (const [rangeType, rangeSubtype, params] of ranges) {
        if ((rangeType === target || rangeType === "*" || target === "*")
            && (rangeSubtype === subtarget || rangeSubtype === "*" || subtarget === "*")) {
          let fit = (rangeType === target ? 100 : 0) + (rangeSubtype === subtarget ? 10 : 0);
          for (const key of Object.keys(targetParams)) if (key !== "q" && params[key] === targetParams[key]) fit += 1;
          if (fit > best) { best = fit; quality = parseFloat(params.q); }
        }
      }
      return [best, quality];
    },
    // The supported type the Accept header prefers ("" for none). Ties go as CouchDB's do: its
    // candidates are sorted as text ("fitness,quality,index,type") and the last one wins.
    bestMatch(supported, accept) {
      const ranges = accept.split(",").map(mime.parseRange);
      const weighted = supported.map((type, index) => [mime.fitness(type, ranges), String(index), type]);
      weighted.sort();
      const last = weighted[weighted.length - 1];
      return last && last[0][1] ? last[2] : "";
    },
    run(request, designDocument) {
      let key = null;
      const accept = request && request.headers ? request.headers["Accept"] : undefined;
      if (request && request.query && request.query.format) {
        key = request.query.format;
        const types = mime.byKey.get(key);
        // A format no registerType named fails as CouchDB's does (a TypeError there: render_error).
        if (!types) throw new ProtocolError("render_error", "function raised error: no type is registered as the format " + key);
        mime.chosenType = types[0];
      } else if (accept) {
        const supported = [];
        for (const [offeredKey] of mime.offered.slice().reverse()) supported.push(...(mime.byKey.get(offeredKey) || []));
        mime.chosenType = mime.bestMatch(supported, accept);
        key = mime.keyByType.get(mime.chosenType) || null;
      } else {
        key = mime.offered[0][0];
        mime.chosenType = (mime.byKey.get(key) || [null])[0];
      }
      const chosen = mime.offered.find(([offeredKey]) => offeredKey === key);
      if (!chosen) {
        const types = mime.offered.map(([offeredKey]) => (mime.byKey.get(offeredKey) || []).join(", ") || offeredKey);
        throw ["error", "not_acceptable", "Content-Type " + (accept || key) + " not supported, try one of: " + types.join(", ")];
      }
      return chosen[1].call(designDocument);
    },
    withType(response) {
      response.headers = response.headers || {};
      if (mime.chosenType) response.headers["Content-Type"] = response.headers["Content-Type"] || mime.chosenType;
      return response;
    },
  };
  mime.register("all", "*/*");
  mime.register("text", "text/plain; charset=utf-8", "txt");
  mime.register("html", "text/html; charset=utf-8");
  mime.register("xhtml", "application/xhtml+xml", "xhtml");
  mime.register("xml", "application/xml", "text/xml", "application/x-xml");
  mime.register("js", "text/javascript", "application/javascript", "application/x-javascript");
  mime.register("css", "text/css");
  mime.register("ics", "text/calendar");
  mime.register("csv", "text/csv");
  mime.register("rss", "application/rss+xml");
  mime.register("atom", "application/atom+xml");
  mime.register("yaml", "application/x-yaml", "text/yaml");
  mime.register("multipart_form", "multipart/form-data");
  mime.register("url_encoded_form", "application/x-www-form-urlencoded");
  mime.register("json", "application/json", "text/x-json");
  helpers.registerType = (key, ...types) => mime.register(key, ...types);
  helpers.provides = (key, fun) => { mime.offered.push([key, fun]); };

  for (const name of Object.keys(helpers)) global[name] = helpers[name];

  // A function from its source text, evaluated where it sees the global helpers only.
  function compile(source, designDocument) {
    let fn;
    try {
      const make = new Function("require", "return (" + source + "\n);");
      fn = make(designDocument ? requireFrom(designDocument) : undefined);
    } catch (error) {
      throw new ProtocolError("compilation_error", String(error) + " (" + String(source).slice(0, 200) + ")");
    }
    if (typeof fn !== "function") {
      throw new ProtocolError("compilation_error", "Expression does not eval to a function. (" + String(source).slice(0, 200) + ")");
    }
    return fn;
  }

  // CommonJS `require` over a design document's string members (and `add_lib`'s library).
  function requireFrom(root) {
    const cache = new Map();
    function load(path, parent) {
      const parts = path.startsWith(".") && parent ? parent.slice(0, -1) : [];
      for (const part of path.split("/")) {
        if (part === "..") parts.pop(); else if (part !== "." && part !== "") parts.push(part);
      }
      const key = parts.join("/");
      if (cache.has(key)) return cache.get(key).exports;
      let node = root;
      for (const part of parts) {
        node = node == null ? undefined : node[part];
        if (node === undefined) throw new ProtocolError("invalid_require_path", "Object has no property \"" + part + "\". " + key);
      }
      if (typeof node !== "string") throw new ProtocolError("invalid_require_path", "Must require a JavaScript string, not: " + typeof node);
      const module = { id: key, exports: {} };
      cache.set(key, module);
      const body = new Function("module", "exports", "require", node);
      body(module, module.exports, (next) => load(next, parts));
      return module.exports;
    }
    return (path) => load(path, null);
  }

  function mapDocument(doc) {
    return mapFunctions.map((fn) => {
      emitted = [];
      try {
        fn(doc);
        return emitted;
      } catch (error) {
        // As CouchDB: the document is left out of this view, and the reason is logged.
        log("function raised exception (" + describe(error) + ") with doc._id " + (doc && doc._id));
        return [];
      } finally {
        emitted = null;
      }
    });
  }

  function reduce(sources, keysAndValues) {
    const keys = keysAndValues.map((pair) => pair[0]), values = keysAndValues.map((pair) => pair[1]);
    return [true, sources.map((source) => compile(source, { lib: library })(keys, values, false))];
  }

  function rereduce(sources, values) {
    return [true, sources.map((source) => compile(source, { lib: library })(null, values, true))];
  }

  function describe(error) {
    if (error && typeof error === "object" && !(error instanceof Error)) return JSON.stringify(error);
    return String(error);
  }

  function designFunction(id, path) {
    const entry = designDocuments.get(id);
    if (!entry) throw new ProtocolError("query_protocol_error", "uncached design doc: " + id);
    const key = path.join("\u0000");
    if (!entry.compiled.has(key)) {
      let source = entry.body;
      for (const part of path) source = source == null ? undefined : source[part];
      if (typeof source !== "string") {
        throw new ProtocolError("not_found", "missing function " + path.join(".") + " in " + id);
      }
      entry.compiled.set(key, compile(source, entry.body));
    }
    return entry.compiled.get(key);
  }

  // What a show or update function throws is CouchDB's render_error, unless it is an error
  // it names ({error, reason} or ["error", name, reason]), passed on as it is.
  function rendering(call) {
    try {
      return call();
    } catch (error) {
      if (error instanceof ProtocolError || (Array.isArray(error) && error[0] === "error")) throw error;
      if (error && typeof error === "object" && !(error instanceof Error) && error.error !== undefined && error.reason !== undefined) throw error;
      throw new ProtocolError("render_error", "function raised error: " + String(error) + " \nstacktrace: " + (error && error.stack));
    }
  }

  function wrapResponse(answer) { return typeof answer === "string" ? { body: answer } : answer; }

  function runDesignFunction(id, path, args) {
    const fn = designFunction(id, path);
    switch (path[0]) {
      case "validate_doc_update":
        try {
          fn.apply(null, args);
          return 1;
        } catch (error) {
          // A thrown value is the answer ({forbidden: …}, {unauthorized: …}, or anything
          // else, which CouchDB reports as unknown_error); an exception is an error.
          // (SpiderMonkey's out-of-memory is the string "out of memory": the process's failure.)
          if (error instanceof Error || error instanceof ProtocolError || error === "out of memory") throw error;
          if (error && typeof error === "object" && error.forbidden !== undefined) return { forbidden: error.forbidden };
          if (error && typeof error === "object" && error.unauthorized !== undefined) return { unauthorized: error.unauthorized };
          return error === undefined ? null : error;
        }
      case "filters": {
        const [docs, request] = args;
        return [true, docs.map((doc) => Boolean(fn(doc, request)))];
      }
      case "views": {
        const [docs] = args;
        return [true, docs.map((doc) => {
          emitted = [];
          try { fn(doc); return emitted.length > 0; } finally { emitted = null; }
        })];
      }
      // Shows and updates as CouchDB's main.js runs them: `this` is the design document, a
      // string answer is the body, anything else the response object.
      case "shows": {
        // A show may also `send` and `start` as a list does, and `provides` renderings.
        const designDocument = designDocuments.get(id).body;
        mime.reset();
        listing = { chunks: [], head: null, started: true, lastRow: true };
        try {
          let answer = wrapResponse(rendering(() => fn.apply(designDocument, args)) || {});
          if (typeof answer !== "object") throw new ProtocolError("render_error", "undefined response from show function");
          if (listing.chunks.length > 0) {
            answer.headers = Object.assign(answer.headers || {}, listing.head || {});
            answer.body = listing.chunks.join("") + (answer.body || "");
            listing.chunks = [];
          }
          if (mime.offered.length > 0) {
            const provided = wrapResponse(rendering(() => mime.run(args[1], designDocument)) || {});
            answer.body = (answer.body || "") + listing.chunks.join("") + (provided.body || "");
            answer = mime.withType(answer);
          }
          return ["resp", answer];
        } finally {
          listing = null;
          mime.reset();
        }
      }
      case "lists": {
        listing = { chunks: [], head: null, started: false, lastRow: false };
        mime.reset();
        try {
          const designDocument = designDocuments.get(id).body;
          let tail = rendering(() => fn.apply(designDocument, args));
          if (mime.offered.length > 0) tail = rendering(() => mime.run(args[1], designDocument));
          if (tail !== undefined && tail !== null) listing.chunks.push(String(tail));
          while (!listing.lastRow) helpers.getRow();  // every row is read, as CouchDB's does
          return ["end", listing.chunks];
        } finally {
          listing = null;
          mime.reset();
        }
      }
      case "updates": {
        if (args[1] && args[1].method === "GET") throw new ProtocolError("method_not_allowed", "Update functions do not allow GET");
        const result = rendering(() => fn.apply(designDocuments.get(id).body, args)) || [];
        const answer = result[1];
        if (answer === null || (typeof answer !== "object" && typeof answer !== "string")) {
          throw new ProtocolError("render_error", "undefined response from update function");
        }
        return ["up", result[0] === undefined ? null : result[0], wrapResponse(answer)];
      }
      default:
        throw new ProtocolError("unknown_command", "sofa-js does not run " + path[0] + " functions");
    }
  }

  function handle(command) {
    switch (command[0]) {
      case "reset":
        config = command[1] || {};
        mapFunctions = [];
        return true;
      case "add_fun":
        mapFunctions.push(compile(command[1], { lib: library }));
        return true;
      case "add_lib":
        library = command[1] || {};
        return true;
      case "map_doc":
        return mapDocument(command[1]);
      case "reduce":
        return reduce(command[1], command[2]);
      case "rereduce":
        return rereduce(command[1], command[2]);
      case "ddoc":
        if (command[1] === "new") {
          designDocuments.set(command[2], { body: command[3], compiled: new Map() });
          return true;
        }
        return runDesignFunction(command[1], command[2], command[3]);
      default:
        throw new ProtocolError("unknown_command", "unknown command '" + command[0] + "'");
    }
  }

  for (let line = readLine(); line !== null; line = readLine()) {
    if (line === "") continue;
    let answer;
    try {
      answer = handle(JSON.parse(line));
    } catch (error) {
      if (error instanceof ProtocolError) {
        answer = ["error", error.error, error.reason];
      } else if (Array.isArray(error) && error[0] === "error" && error.length === 3) {
        answer = ["error", String(error[1]), String(error[2])];  // throw(["error", name, reason]), as CouchDB's functions may
      } else if (error && typeof error === "object" && error.error !== undefined && !(error instanceof Error)) {
        answer = ["error", String(error.error), String(error.reason === undefined ? "" : error.reason)];
      } else {
        answer = ["error", error instanceof Error ? error.name : "error", describe(error)];
      }
    }
    respond(answer);
  }
})(globalThis);
)JS";
