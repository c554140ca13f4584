import DocumentModel
import Foundation
import QueryServer

/// Reduce functions: CouchDB's built-in ones here, JavaScript ones in the query server (in
/// pieces, then `rereduce`d, as CouchDB's B-tree does).
public enum ViewReduce {
    static let piece = 1000

    public static func reduce(_ source: String, _ rows: [ViewRow]) throws -> JSONValue {
        switch source.trimmingCharacters(in: .whitespacesAndNewlines) {
        case "_count": return .integer(Int64(rows.count))
        // A value these cannot add up is CouchDB's error object in the row, not a failed request.
        case "_sum":
            do { return try sum(rows.map(\.value)) } catch let error as BuiltinReduceError { return error.value }
        case "_stats": return try stats(rows.map(\.value))
        case "_approx_count_distinct":
            var seen = Set<[UInt8]>()
            for row in rows { seen.insert(Collation.key(row.key)) }
            return .integer(Int64(seen.count))
        case let other where other.hasPrefix("_"):
            throw SofaError.invalidQuery(error: "query_parse_error", reason: "Unknown builtin reduce function: \(other)")
        default:
            return try javascript(source, rows)
        }
    }

    /// A JavaScript reduce; one that throws reduces to null, as in CouchDB 3.4.
    private static func javascript(_ source: String, _ rows: [ViewRow]) throws -> JSONValue {
        do {
            return try QueryServerPool.shared.withProcess { process in
                let timeout = QueryServerPool.shared.timeout
                var partials: [JSONValue] = []
                for start in stride(from: 0, to: max(rows.count, 1), by: piece) {
                    let pairs: [JSONValue] = rows[start..<min(start + piece, rows.count)].map { [[$0.key, .string($0.docID)], $0.value] }
                    let answer = try process.call(["reduce", [.string(source)], .array(pairs)], timeout: timeout)
                    partials.append(answer[1]?[0] ?? .null)
                }
                if partials.count == 1 { return partials[0] }
                let answer = try process.call(["rereduce", [.string(source)], .array(partials)], timeout: timeout)
                return answer[1]?[0] ?? .null
            }
        } catch let error as QueryServerError {
            switch error {
            case .function: return .null
            default: throw SofaError.designFunctionFailed(error: "os_process_error", reason: "\(error)")
            }
        }
    }

    /// CouchDB's answer for values a built-in reduce cannot take, shown as the row's value.
    struct BuiltinReduceError: Error {
        let value: JSONValue

        init(reason: String, causedBy: JSONValue) {
            value = ["error": "builtin_reduce_error", "reason": .string(reason), "caused_by": causedBy]
        }
    }

    private static func sumError(_ value: JSONValue) -> BuiltinReduceError {
        BuiltinReduceError(reason: "The _sum function requires that map values be numbers, arrays of numbers, or objects. Objects cannot be mixed with other data structures. Objects can be arbitrarily nested, provided that the values for all fields are themselves numbers, arrays of numbers, or objects.",
                           causedBy: value)
    }

    /// CouchDB's `_sum`: numbers, arrays of numbers element by element, objects field by field.
    static func sum(_ values: [JSONValue]) throws -> JSONValue {
        var total: JSONValue = .integer(0)
        var refused: JSONValue?
        for value in values {
            do { total = try add(total, value) } catch { refused = value }  // CouchDB names the last one it met
        }
        if let refused { throw sumError(refused) }
        return total
    }

    private static func add(_ a: JSONValue, _ b: JSONValue) throws -> JSONValue {
        switch (a, b) {
        case (.integer(let x), .integer(let y)):
            let (sum, overflow) = x.addingReportingOverflow(y)
            return overflow ? .double(Double(x) + Double(y)) : .integer(sum)
        case (_, _) where a.numberValue != nil && b.numberValue != nil:
            return .double(a.numberValue! + b.numberValue!)
        case (.array(let x), .array(let y)):
            var result: [JSONValue] = []
            for index in 0..<max(x.count, y.count) {
                result.append(try add(index < x.count ? x[index] : .integer(0), index < y.count ? y[index] : .integer(0)))
            }
            return .array(result)
        case (.integer(0), .array), (.integer(0), .object): return b
        case (.array(let x), _) where b.numberValue != nil:
            return .array(try x.enumerated().map { try $0.offset == 0 ? add($0.element, b) : $0.element })
        case (.object(let x), .object(let y)):
            var result = x
            for (key, value) in y { result[key] = try result[key].map { try add($0, value) } ?? value }
            return .object(result)
        default:
            throw sumError(b)
        }
    }

    /// CouchDB's `_stats` of numbers: sum, count, min, max, sumsqr.
    static func stats(_ values: [JSONValue]) throws -> JSONValue {
        var sum: JSONValue = .integer(0), sumsqr: JSONValue = .integer(0)
        var low: JSONValue?, high: JSONValue?
        for value in values {
            guard let number = value.numberValue else {
                // CouchDB fails the request (its reason shows the Erlang term).
                throw SofaError.designFunctionFailed(error: "invalid_value",
                                reason: "The _stats function requires that map values be numbers or arrays of numbers, not '\(value.jsonString())'")
            }
            sum = try add(sum, value)
            sumsqr = try add(sumsqr, value.isInteger ? .integer(Int64(number) &* Int64(number)) : .double(number * number))
            if low.map({ number < $0.numberValue! }) ?? true { low = value }
            if high.map({ number > $0.numberValue! }) ?? true { high = value }
        }
        return ["sum": sum, "count": .integer(Int64(values.count)), "min": low ?? .integer(0), "max": high ?? .integer(0), "sumsqr": sumsqr]
    }
}

private extension JSONValue {
    var numberValue: Double? {
        switch self {
        case .integer(let value): Double(value)
        case .double(let value): value
        case .bigInteger(let digits): Double(digits)
        default: nil
        }
    }

    var isInteger: Bool { if case .integer = self { true } else { false } }
}
