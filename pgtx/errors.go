package pgtx

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATE codes this module acts on. See https://www.postgresql.org/docs/current/errcodes-appendix.html.
const (
	CodeSerializationFailure = "40001"
	CodeCheckViolation       = "23514"
	CodeUndefinedTable       = "42P01"
	CodeUndefinedFunction    = "42883"
	CodeInvalidSchemaName    = "3F000"
	CodeInFailedTransaction  = "25P02"
)

// Codes only this package tests for.
const (
	codeDeadlockDetected = "40P01"
	codeUniqueViolation  = "23505"
	codeAdminShutdown    = "57P01"
)

// SQLState returns the SQLSTATE of the PostgreSQL error in err's chain, or "" if there is none.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// IsSerializationFailure reports SQLSTATE 40001: the transaction lost a race under
// REPEATABLE READ or SERIALIZABLE and left nothing behind. Retrying it as a new transaction is safe.
func IsSerializationFailure(err error) bool { return SQLState(err) == CodeSerializationFailure }

// IsRetryableTx reports whether a whole transaction that failed with err may be run again from
// the start: serialization failures and deadlocks. Anything else (including a connection lost
// during COMMIT, whose outcome is unknown) is not retried here.
func IsRetryableTx(err error) bool {
	switch SQLState(err) {
	case CodeSerializationFailure, codeDeadlockDetected:
		return true
	}
	return false
}

// IsUniqueViolation reports SQLSTATE 23505.
func IsUniqueViolation(err error) bool { return SQLState(err) == codeUniqueViolation }

// IsUndefinedTable reports SQLSTATE 42P01, which here nearly always means migrations were not applied.
func IsUndefinedTable(err error) bool { return SQLState(err) == CodeUndefinedTable }

// IsConnectionError reports an error that happened at the connection level rather than as a
// PostgreSQL error response: a dropped network connection, a terminated backend
// (pg_terminate_backend sends 57P01 before closing) or a server shutting down.
func IsConnectionError(err error) bool {
	if err == nil {
		return false
	}
	switch SQLState(err) {
	case codeAdminShutdown, "57P02", "57P03", "08000", "08003", "08006", "08001", "08004":
		return true
	case "":
		var pgErr *pgconn.PgError
		return !errors.As(err, &pgErr) && (pgconn.SafeToRetry(err) || pgconn.Timeout(err) || isClosedConn(err))
	}
	return false
}

func isClosedConn(err error) bool {
	var connectErr *pgconn.ConnectError
	return errors.As(err, &connectErr)
}
