// sofa-js: Sofa's JavaScript query server. SpiderMonkey 102 running `QueryServer.js`, which
// speaks CouchDB's query-server protocol (one JSON command per line on stdin, one JSON answer
// per line on stdout). The host gives the script two functions, `readline()` and `print()`,
// and nothing else: design-document functions see the ECMAScript built-ins only, with no
// file, network or process access. Memory is capped (--max-heap-mib, default 256); time is
// limited by the caller, which kills a process that does not answer in time.
#include <jsapi.h>
#include <js/CompilationAndEvaluation.h>
#include <js/Conversions.h>
#include <js/ErrorReport.h>
#include <js/Exception.h>
#include <js/Initialization.h>
#include <js/SourceText.h>

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

extern const char sofaQueryServerScript[];

namespace {

const JSClass globalClass = {"global", JSCLASS_GLOBAL_FLAGS, &JS::DefaultGlobalClassOps};

/// `print(text)`: one line on stdout, flushed (the caller waits for it).
bool print(JSContext* cx, unsigned argc, JS::Value* vp) {
    JS::CallArgs args = JS::CallArgsFromVp(argc, vp);
    JS::RootedString text(cx, JS::ToString(cx, args.get(0)));
    if (!text) return false;
    JS::UniqueChars bytes = JS_EncodeStringToUTF8(cx, text);
    if (!bytes) return false;
    std::fputs(bytes.get(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    args.rval().setUndefined();
    return true;
}

/// `readline()`: the next line of stdin without its newline, or null at the end.
bool readline(JSContext* cx, unsigned argc, JS::Value* vp) {
    JS::CallArgs args = JS::CallArgsFromVp(argc, vp);
    std::string line;
    int c;
    while ((c = std::getchar()) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    if (c == EOF && line.empty()) {
        args.rval().setNull();
        return true;
    }
    JSString* text = JS_NewStringCopyUTF8N(cx, JS::UTF8Chars(line.data(), line.size()));
    if (!text) return false;
    args.rval().setString(text);
    return true;
}

/// The pending exception, as text for stderr.
std::string pendingException(JSContext* cx) {
    JS::ExceptionStack stack(cx);
    if (!JS::StealPendingExceptionStack(cx, &stack)) return "unknown error";
    JS::ErrorReportBuilder report(cx);
    if (!report.init(cx, stack, JS::ErrorReportBuilder::WithSideEffects)) return "unprintable error";
    return report.toStringResult().c_str() ? report.toStringResult().c_str() : "error";
}

}  // namespace

int main(int argc, char** argv) {
    uint32_t maxHeapMiB = 256;
    for (int i = 1; i < argc; i++) {
        if (std::strcmp(argv[i], "--max-heap-mib") == 0 && i + 1 < argc) {
            maxHeapMiB = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
        } else {
            std::fprintf(stderr, "usage: sofa-js [--max-heap-mib N]\n");
            return 2;
        }
    }
    // The GC's limit does not cover everything a script can allocate (array elements are
    // malloc'd); the data segment limit does, and an allocation past it is an "out of memory"
    // exception in the script rather than a machine that swaps.
    const rlim_t dataLimit = (static_cast<rlim_t>(maxHeapMiB) + 64) * 1024 * 1024;
    struct rlimit limit = {dataLimit, dataLimit};
    setrlimit(RLIMIT_DATA, &limit);
    if (!JS_Init()) return 1;
    JSContext* cx = JS_NewContext(JS::DefaultHeapMaxBytes);
    if (!cx) return 1;
    JS_SetGCParameter(cx, JSGC_MAX_BYTES, maxHeapMiB * 1024u * 1024u);
    JS_SetNativeStackQuota(cx, 4 * 1024 * 1024);
    if (!JS::InitSelfHostedCode(cx)) return 1;
    int status = 0;
    {
        JS::RealmOptions options;
        JS::RootedObject global(cx, JS_NewGlobalObject(cx, &globalClass, nullptr, JS::FireOnNewGlobalHook, options));
        if (!global) return 1;
        JSAutoRealm realm(cx, global);
        if (!JS_DefineFunction(cx, global, "print", print, 1, 0) || !JS_DefineFunction(cx, global, "readline", readline, 0, 0)) {
            return 1;
        }
        JS::CompileOptions compile(cx);
        compile.setFileAndLine("QueryServer.js", 1);
        JS::SourceText<mozilla::Utf8Unit> source;
        if (!source.init(cx, sofaQueryServerScript, std::strlen(sofaQueryServerScript), JS::SourceOwnership::Borrowed)) return 1;
        JS::RootedValue result(cx);
        if (!JS::Evaluate(cx, compile, source, &result)) {
            std::fprintf(stderr, "sofa-js: %s\n", pendingException(cx).c_str());
            status = 1;
        }
    }
    JS_DestroyContext(cx);
    JS_ShutDown();
    return status;
}
