import CCurl

/// The one place libcurl return codes are checked: a failed call becomes an `UpstreamError` naming the call and
/// libcurl's own explanation, so none is ignored.
enum CurlCall {
  static func check(_ code: CURLcode, _ operation: @autoclosure () -> String) throws(UpstreamError) {
    guard code == CURLE_OK else {
      throw UpstreamError(.transport, "\(operation()) failed", cause: String(cString: curl_easy_strerror(code)))
    }
  }

  static func check(_ code: CURLMcode, _ operation: @autoclosure () -> String) throws(UpstreamError) {
    guard code == CURLM_OK else {
      throw UpstreamError(.transport, "\(operation()) failed", cause: String(cString: curl_multi_strerror(code)))
    }
  }
}
