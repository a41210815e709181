package pgtx

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/wmonce/watermill-once/internal/pgwire"
)

// SQLSTATE codes this module acts on (PostgreSQL manual, appendix A).
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

// IsSerializationFailure reports SQLSTATE 40001: safe to retry as a new transaction.
func IsSerializationFailure(err error) bool { return SQLState(err) == CodeSerializationFailure }

// IsRetryableTx reports whether a transaction that failed with err may run again from the start:
// serialization failures and deadlocks (never a COMMIT of unknown outcome).
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

// IsConnectionError reports a failure of the connection rather than a PostgreSQL error response:
// a dropped connection, a terminated backend (57P01) or a server shutting down.
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

// IsAttemptGuardRefusal reports an error of the attempt guard: user code ended (COMMIT,
// ROLLBACK) a transaction the library lent it, or ran a statement in it after that.
func IsAttemptGuardRefusal(err error) bool { return SQLState(err) == pgwire.CodeAttemptGuard }
