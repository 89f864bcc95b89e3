package connwatch

import "time"

// aLongTimeAgo is a deadline that has passed: it makes a blocked read
// return at once (net/http uses the same trick).
var aLongTimeAgo = time.Unix(1, 0)
